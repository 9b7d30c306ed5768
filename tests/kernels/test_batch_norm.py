"""Batch norm as CUDA runs it: the backend PyTorch picks and the native kernels' launches,
checked against Normalization.cpp / Normalization.cu(h) worked by hand."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch import nn

from nnperf.analysis import analyze
from nnperf.hardware import default_profile, load_gpu
from nnperf.kernels import batch_norm as bn
from nnperf.kernels.native_loops import loop_kernel_time
from nnperf.passes.kernel_calls import batch_norm_call
from nnperf.prediction import predict_analysis


class ConvBN(nn.Module):
    def __init__(self, c: int = 64) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, c, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x))


def _analysis(batch=64, hw=112, amp="bf16", train=True, channels_last=False):
    return analyze(ConvBN(), torch.randn(batch, 3, hw, hw), train=train, optimizer="none", amp=amp,
                   channels_last=channels_last)


def _events(analysis, name):
    return [e for e in analysis.trace.events if e.name == name]


@pytest.fixture(scope="module")
def bf16_train():
    return _analysis()


def test_the_call_of_a_bf16_autocast_batch_norm(bf16_train):
    fwd = batch_norm_call(_events(bf16_train, "aten.native_batch_norm")[0])
    assert (fwd.batch, fwd.channels, fwd.spatial, fwd.itemsize) == (64, 64, 112 * 112, 2)
    assert fwd.input_dtype == "bf16" and fwd.weight_dtype == "fp32" and fwd.training and not fwd.backward
    assert fwd.contiguous and not fwd.channels_last
    bwd = batch_norm_call(_events(bf16_train, "aten.native_batch_norm_backward")[0])
    # the convolution before it has weights, so its output (the input here) needs a gradient
    assert bwd.backward and bwd.want_input_grad and bwd.want_param_grads


def _call(**changes):
    base = bn.BatchNormCall(batch=32, channels=64, spatial=3136, itemsize=4, input_dtype="fp32",
                            weight_dtype="fp32", has_bias=True, running_stats=True, training=True,
                            backward=False, want_input_grad=True, want_param_grads=True,
                            channels_last=False, contiguous=True, eps=1e-5, numel=32 * 64 * 3136)
    return dataclasses.replace(base, **changes)


def test_cudnn_is_chosen_as_select_batch_norm_backend_does():
    assert bn.uses_cudnn(_call())  # fp32
    assert bn.uses_cudnn(_call(input_dtype="fp16", itemsize=2))  # fp16 input with fp32 weights (AMP)
    assert not bn.uses_cudnn(_call(input_dtype="bf16", itemsize=2))  # bf16 autocast
    assert not bn.uses_cudnn(_call(input_dtype="fp16", itemsize=2, weight_dtype="fp16"))  # .half() model
    assert not bn.uses_cudnn(_call(input_dtype="bf16", itemsize=2, weight_dtype="bf16"))
    assert not bn.uses_cudnn(_call(weight_dtype=None))  # affine=False
    assert not bn.uses_cudnn(_call(eps=1e-6))  # below CUDNN_BN_MIN_EPSILON
    assert not bn.uses_cudnn(_call(training=False, batch=65536))  # eval batch above 65535
    assert bn.uses_cudnn(_call(training=True, batch=65536))
    assert not bn.uses_cudnn(_call(), rank=2)  # BatchNorm1d on (N, C)


def test_nchw_training_forward_launches_by_hand():
    call = _call(batch=64, channels=64, spatial=112 * 112, itemsize=2, input_dtype="bf16")
    plan = bn.launches(call, cudnn=False)
    stats, transform = plan.loops
    # getNumThreads(12544) = 512, so (512, 1) threads per channel block; 64 x ceil(12544/512)
    assert (stats.blocks, stats.threads, stats.iterations) == (64, 512, 64 * 25)
    # tf = max(getNumThreads(3136), min(512, 64)) = 512, tb = 1; grid (64, min(262144/64, 64))
    assert (transform.blocks, transform.threads, transform.iterations) == (64 * 64, 512, 25)
    assert stats.bytes == 64 * 64 * 12544 * 2 and transform.bytes == 2 * stats.bytes
    assert plan.small == 1 and plan.streamed == 0


def test_small_planes_stack_images_in_a_block():
    call = _call(batch=64, channels=512, spatial=7 * 7)
    stats = bn.launches(call, cudnn=False).loops[0]
    # getNumThreads(49) = 64: blocks of (64, 8) threads walk 64 / 8 images of one 64-wide row
    assert (stats.threads, stats.iterations) == (512, 8)


def test_nchw_backward_is_one_fused_kernel_with_two_passes():
    call = _call(batch=64, channels=64, spatial=112 * 112, itemsize=2, input_dtype="bf16", backward=True)
    (fused,) = bn.launches(call, cudnn=False).loops
    assert (fused.blocks, fused.threads, fused.iterations) == (64, 512, 2 * 64 * 25)
    assert fused.bytes == 5 * 64 * 64 * 12544 * 2  # dy and x twice, dx once


def test_evaluation_is_the_transform_and_two_small_kernels():
    plan = bn.launches(_call(training=False, input_dtype="bf16", itemsize=2), cudnn=False)
    assert [k.name for k in plan.loops] == ["batch_norm_transform_input_kernel"] and plan.small == 2


def test_channels_last_and_cudnn_outside_nchw_training_stream():
    assert bn.launches(_call(channels_last=True), cudnn=False) == bn.Launches(streamed=2, small=1)
    assert bn.launches(_call(channels_last=True, backward=True), cudnn=False) == bn.Launches(streamed=2)
    assert bn.launches(_call(channels_last=True), cudnn=True) == bn.Launches(streamed=1)
    assert bn.launches(_call(training=False), cudnn=True) == bn.Launches(streamed=1)


def test_cudnn_nchw_training_is_a_loop_over_each_channel_by_hand():
    # 32 images of 56x56 per channel: 100,352 elements over 512 threads = 196 per sweep
    (forward,) = bn.launches(_call(), cudnn=True).loops
    assert (forward.blocks, forward.threads, forward.iterations) == (64, 512, 196)  # two sweeps, two a step
    assert forward.library == "cudnn" and forward.bytes == 3 * 32 * 64 * 3136 * 4
    (backward,) = bn.launches(_call(backward=True), cudnn=True).loops
    assert (backward.blocks, backward.threads, backward.iterations) == (64, 512, 2 * 196)
    assert backward.bytes == 5 * 32 * 64 * 3136 * 4
    gpu = load_gpu("h200-sxm")
    profile = default_profile(gpu).replace(loop_iteration_cycles=1000.0, cudnn_batch_norm_loop_fraction=0.5)
    # 64 blocks fit one wave; each iteration 500 cycles at 1980 MHz, or the bytes at the floor
    by_hand = max(196 * 500 / 1980e6, profile.memory_time(gpu.memory_bandwidth, forward.bytes))
    assert loop_kernel_time(forward, gpu, profile) == pytest.approx(by_hand)


def test_the_time_model_sums_the_loops_and_launches(bf16_train):
    gpu = load_gpu("h200-sxm")
    profile = default_profile(gpu)
    prediction = predict_analysis(bf16_train, gpu, profile)
    fwd = next(t for t in prediction.step.ops if t.op == "aten.native_batch_norm")
    call = batch_norm_call(fwd.count.event)
    stats, transform = bn.launches(call, cudnn=False).loops
    by_hand = sum(math.ceil(k.blocks / (4 * 132)) * k.iterations * profile.loop_iteration_cycles / 1980e6
                  for k in (stats, transform))
    assert loop_kernel_time(stats, gpu, profile) + loop_kernel_time(transform, gpu, profile) == pytest.approx(by_hand)
    assert fwd.kernels == 3
    assert fwd.kernel_s == pytest.approx(by_hand + 3 * profile.kernel_overhead_s)


def test_fp32_training_batch_norm_runs_cudnns_loop():
    gpu = load_gpu("h200-sxm")
    profile = default_profile(gpu)
    fp32 = predict_analysis(_analysis(amp=None), gpu, profile)
    fwd = next(t for t in fp32.step.ops if t.op == "aten.native_batch_norm")
    assert fwd.kernels == 1  # cuDNN's kernel: 64 channels of 64x112x112, 1,568 steps of 512 threads
    cycles = profile.loop_iteration_cycles * profile.cudnn_batch_norm_loop_fraction
    assert fwd.kernel_s == pytest.approx(1568 * cycles / 1980e6 + profile.kernel_overhead_s)
