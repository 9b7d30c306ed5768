"""Depthwise convolutions: which kernels, and their launch shapes by hand."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nnperf.analysis import analyze
from nnperf.hardware import default_profile, load_gpu
from nnperf.kernels import depthwise
from nnperf.passes.kernel_calls import depthwise_call


def _events(amp=None, channels_last=False, batch=8):
    dw = nn.Sequential(nn.Conv2d(32, 32, 1), nn.Conv2d(32, 32, 5, stride=2, padding=2, groups=32))
    a = analyze(dw, torch.randn(batch, 32, 28, 28), train=True, optimizer="none", amp=amp, channels_last=channels_last)
    fwd = [e for e in a.trace.events if e.name == "aten.convolution"][1]
    bwd = next(e for e in a.trace.events if e.name == "aten.convolution_backward")  # the last layer's first
    return fwd, bwd


def test_calls_and_paths():
    fwd, bwd = _events()
    call = depthwise_call(fwd)
    assert (call.batch, call.channels, call.input_positions, call.output_positions, call.taps) == (8, 32, 784, 196, 25)
    assert call.path == "native" and call.rate_key == "native_fp32"
    assert call.output_macs == 8 * 32 * 196 * 25 and call.input_taps == 8 * 32 * 784 * 25
    back = depthwise_call(bwd)
    assert back.backward and back.want_input_grad and back.want_weight_grad
    assert depthwise_call(_events(amp="bf16")[0]).rate_key == "native_bf16"
    assert depthwise_call(_events(amp="fp16")[0]).path == "cudnn"  # use_cudnn_depthwise takes fp16
    assert depthwise_call(_events(channels_last=True)[0]).rate_key == "cudnn_fp32"


def test_rates_come_from_the_profile_per_sm_and_clock():
    call = depthwise_call(_events()[0])
    a100, h100 = load_gpu("a100-80gb-sxm"), load_gpu("h100-sxm")
    # native fp32 at 25 taps: 5.74 MACs per SM per clock ([default.depthwise_rate])
    assert depthwise.rate(call, a100, default_profile(a100)) == pytest.approx(5.74 * 108 * 1410e6)
    cudnn = depthwise_call(_events(channels_last=True)[0])
    assert depthwise.rate(cudnn, a100, default_profile(a100)) is None  # measured on Hopper only
    assert depthwise.rate(cudnn, h100, default_profile(h100)) == pytest.approx(12.3 * 132 * 1980e6)


def test_interpolation_between_measured_kernel_areas():
    call = depthwise_call(_events()[0])
    profile = default_profile(load_gpu("a100-80gb-sxm")).replace(depthwise_rate={"native_fp32": ((9.0, 2.0), (49.0, 6.0))})
    import math
    expected = 2.0 + (math.log(25) - math.log(9)) / (math.log(49) - math.log(9)) * 4.0  # linear in log(taps)
    assert depthwise.rate(call, load_gpu("a100-80gb-sxm"), profile) == pytest.approx(expected * 108 * 1410e6)


def test_the_weight_gradient_loop_by_hand():
    call = depthwise_call(_events(batch=8)[1])
    loop = depthwise.grad_weight_loop(call, 100.0, 200.0)
    # 32 channels x 25 taps; min(8 x 32, 256) = 256 threads, 8 warps: one image each, 196 outputs
    assert (loop.blocks, loop.threads, loop.iterations, loop.bytes) == (800, 256, 1 * 7, 300.0)
    big = depthwise_call(_events(batch=2)[1])
    loop = depthwise.grad_weight_loop(big, 0.0, 0.0)
    assert (loop.threads, loop.iterations) == (64, 1 * 7)  # 2 warps for 2 images
