"""Convolution kernels that are not implicit GEMMs: depthwise convolutions run PyTorch's
direct kernels (DepthwiseConv2d.cu) on CUDA cores, bound by the bytes they move."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nnperf.analysis import analyze
from nnperf.hardware import default_profile, load_gpu
from nnperf.passes.costs.matmul import winograd_fraction
from nnperf.prediction import predict_analysis


class Block(nn.Module):
    """A MobileNet block's convolutions: 1x1 expansion, 3x3 depthwise, 1x1 projection (the
    first makes the depthwise input need a gradient)."""

    def __init__(self, c: int = 64) -> None:
        super().__init__()
        self.expand = nn.Conv2d(c, c, 1, bias=False)
        self.dw = nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False)
        self.pw = nn.Conv2d(c, c, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pw(self.dw(self.expand(x)))


# Every read from DRAM: the block's 25.7 MB activations would otherwise be found in the A100's
# L2 by the next kernel (that is tests/passes/test_l2_reuse.py's subject, not this file's).
A100_DRAM = load_gpu("a100-80gb-sxm", overrides={"l2_reuse_mb": "0"})


@pytest.fixture(scope="module")
def prediction():
    analysis = analyze(Block(), torch.randn(32, 64, 56, 56), train=True, optimizer="none")
    return predict_analysis(analysis, A100_DRAM)


def _ops(prediction, module: str) -> dict[str, object]:
    return {t.phase: t for t in prediction.step.ops if t.module == module and t.category == "conv"}


def test_depthwise_runs_its_taps_at_the_measured_rate(prediction):
    """fp32 NCHW: PyTorch's direct kernels. Forward: output elements x 9 taps at the profile's
    rate for 9 taps (3.55 MACs per SM per clock on 108 SMs at 1410 MHz), unless its bytes take
    longer. Backward: the input gradient's input elements x 9 taps at that rate, and the
    weight gradient's loop: 64 x 9 blocks of min(32 x 32, 256) threads (one wave on 108 SMs of
    8 such blocks), each warp walking 32 / 8 images of 3136 outputs 32 at a time: 4 x 98
    iterations of one round trip."""
    gpu = A100_DRAM
    profile = default_profile(gpu)
    act = 32 * 64 * 56 * 56 * 4  # one fp32 activation of the block
    weight = 64 * 1 * 3 * 3 * 4
    rate = 3.55 * 108 * 1410e6  # MACs/s at 9 taps ([default.depthwise_rate] native_fp32)
    macs = 32 * 64 * 56 * 56 * 9
    dw = _ops(prediction, "dw")
    fwd, bwd = dw["forward"], dw["backward"]
    assert fwd.kernels == 1
    assert fwd.kernel_s == pytest.approx(
        max(macs / rate, profile.memory_time(gpu.memory_bandwidth, 2 * act + weight)) + profile.kernel_overhead_s,
        rel=1e-9)
    grad_input = max(macs / rate, profile.memory_time(gpu.memory_bandwidth, 2 * act))
    grad_weight = max(4 * 98 * profile.loop_iteration_cycles / 1410e6, profile.memory_time(gpu.memory_bandwidth, 2 * act))
    assert bwd.kernels == 2
    assert bwd.kernel_s == pytest.approx(grad_input + grad_weight + 2 * profile.kernel_overhead_s, rel=1e-9)
    assert fwd.kernel_bound == "compute" and fwd.math == "fp32"


def test_depthwise_without_a_rate_is_bytes_at_achievable_bandwidth():
    """A kernel family the profile has no rate for (cuDNN's, off Hopper): its tensors once
    through DRAM, each gradient reading the output gradient (so it is read twice)."""
    analysis = analyze(Block(), torch.randn(32, 64, 56, 56), train=True, optimizer="none", channels_last=True)
    gpu = A100_DRAM
    profile = default_profile(gpu)
    dw = _ops(predict_analysis(analysis, gpu), "dw")
    act, weight = 32 * 64 * 56 * 56 * 4, 64 * 9 * 4
    assert dw["forward"].kernel_s == pytest.approx(
        profile.memory_time(gpu.memory_bandwidth, 2 * act + weight) + profile.kernel_overhead_s, rel=1e-9)
    assert dw["backward"].kernels == 2
    assert dw["backward"].kernel_s == pytest.approx(
        profile.memory_time(gpu.memory_bandwidth, 4 * act + 2 * weight) + 2 * profile.kernel_overhead_s, rel=1e-9)


def test_pointwise_stays_an_implicit_gemm(prediction):
    pw = _ops(prediction, "pw")["forward"]
    assert [(g.gemm.m, g.gemm.n, g.gemm.k) for g in pw.gemms] == [(32 * 56 * 56, 64, 64)]
    assert pw.math == "tf32"  # cuDNN's default for fp32 convolutions on Ampere


class Dense(nn.Module):
    """Two 3x3 convolutions (the second's input needs a gradient, so both gradients run)."""

    def __init__(self, c: int = 64) -> None:
        super().__init__()
        self.a = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.b = nn.Conv2d(c, c, 3, padding=1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


def _dense(gpu: str, channels_last: bool, amp: str | None = "fp16"):
    analysis = analyze(Dense(), torch.randn(32, 64, 56, 56), train=True, optimizer="none", amp=amp,
                       channels_last=channels_last)
    return {(t.module, t.phase): t for t in predict_analysis(analysis, load_gpu(gpu)).step.ops
            if t.category == "conv"}


def test_nchw_tensor_core_convolutions_pay_the_layout_transposes():
    gpu = load_gpu("a100-80gb-sxm")
    profile = default_profile(gpu)
    nchw, nhwc = _dense("a100-80gb-sxm", False), _dense("a100-80gb-sxm", True)
    act, weight = 32 * 64 * 56 * 56 * 2, 64 * 64 * 3 * 3 * 2  # fp16 under autocast

    def moved(*sizes: int) -> float:
        return sum(profile.memory_time(gpu.memory_bandwidth, 2 * s) + profile.kernel_overhead_s for s in sizes)

    fwd, fwd_cl = nchw[("b", "forward")], nhwc[("b", "forward")]
    assert fwd_cl.kernels == 1 and fwd.kernels == 3  # input and filter in; the kernel writes NCHW
    assert fwd.kernel_s - fwd_cl.kernel_s == pytest.approx(moved(act, weight), rel=1e-9)
    bwd, bwd_cl = nchw[("b", "backward")], nhwc[("b", "backward")]
    # output gradient in; filter in and input gradient back; input in and filter gradient back
    assert bwd.kernels - bwd_cl.kernels == 5
    assert bwd.kernel_s - bwd_cl.kernel_s == pytest.approx(moved(act, weight, act, act, weight), rel=1e-9)


def test_cuda_core_convolutions_run_nchw_natively():
    fp32 = _dense("v100-sxm2", False, amp=None)  # V100 has no TF32: fp32 on CUDA cores
    assert fp32[("b", "forward")].math == "fp32" and fp32[("b", "forward")].kernels == 1


def test_winograd_multiplies_by_hand():
    a = analyze(Dense(), torch.randn(2, 64, 56, 56), train=True, optimizer="none")
    fwd = next(e for e in a.trace.events if e.name == "aten.convolution")
    bwd = next(e for e in a.trace.events if e.name == "aten.convolution_backward")
    # F(2x2,3x3): 16 multiplies per 2x2 tile against 4 x 9 direct: 28*28 tiles on 56x56
    assert winograd_fraction(fwd) == pytest.approx(16 * 28 * 28 / (9 * 56 * 56)) == pytest.approx(1 / 2.25)
    assert winograd_fraction(bwd) == pytest.approx(1 / 2.25)
    odd = analyze(nn.Conv2d(8, 8, 3, padding=1), torch.randn(1, 8, 7, 7), train=False)
    conv = next(e for e in odd.trace.events if e.name == "aten.convolution")
    assert winograd_fraction(conv) == pytest.approx(16 * 4 * 4 / (9 * 7 * 7))  # tiles waste on 7x7
    for layer in (nn.Conv2d(8, 8, 3, stride=2), nn.Conv2d(8, 8, 1), nn.Conv2d(8, 8, 3, groups=2),
                  nn.Conv2d(8, 8, 3, dilation=2)):
        e = next(e for e in analyze(layer, torch.randn(1, 8, 16, 16), train=False).trace.events
                 if e.name == "aten.convolution")
        assert winograd_fraction(e) is None, layer


def test_fp32_3x3_runs_winograd_on_cuda_cores_only():
    from nnperf.kernels.gemm import estimate_gemm

    v100 = load_gpu("v100-sxm2")
    profile = default_profile(v100)
    cuda = profile.conv_efficiency["cuda_core"]  # fp32 on a V100: CUDA cores, any shape
    ops = _dense("v100-sxm2", False, amp=None)
    fwd, bwd = ops[("b", "forward")], ops[("b", "backward")]
    m, n, k = 32 * 56 * 56, 64, 64 * 9
    direct = estimate_gemm(m, n, k, dtype="fp32", gpu=v100, profile=profile).model_compute_s
    assert fwd.model_compute_s == pytest.approx(direct / 2.25 / cuda, rel=1e-9)
    grad_in = estimate_gemm(m, k, n, dtype="fp32", gpu=v100, profile=profile).model_compute_s
    grad_w = estimate_gemm(n, k, m, dtype="fp32", gpu=v100, profile=profile).model_compute_s
    assert bwd.model_compute_s == pytest.approx((grad_in / 2.25 + grad_w) / cuda,
                                                rel=1e-9)  # the weight gradient stays an implicit GEMM
    tf32 = _dense("a100-80gb-sxm", False, amp=None)[("b", "forward")]  # TF32 tensor cores: no Winograd
    a100 = load_gpu("a100-80gb-sxm")
    # stride 1, a 56x56 output: the large stride-1 class
    assert tf32.model_compute_s == pytest.approx(
        estimate_gemm(m, n, k, dtype="fp32", tf32=True, gpu=a100).model_compute_s
        / default_profile(a100).conv_efficiency["stride1_large"], rel=1e-9)


def test_hopper_transposes_run_at_the_measured_rate_and_skip_pointwise_forwards():
    """On Hopper the profile has cuDNN's measured conversion rate: 4.13 bytes per SM and clock
    (132 SMs at 1980 MHz: 1.08 TB/s, below DRAM), and a 1x1 stride-1 forward converts nothing."""
    gpu = load_gpu("h100-sxm")
    profile = default_profile(gpu)
    assert profile.layout_transpose_bytes_per_clock_sm == pytest.approx(4.13)
    nchw, nhwc = _dense("h100-sxm", False), _dense("h100-sxm", True)
    act, weight = 32 * 64 * 56 * 56 * 2, 64 * 64 * 3 * 3 * 2
    rate = 4.13 * 132 * 1980e6
    fwd, fwd_cl = nchw[("b", "forward")], nhwc[("b", "forward")]
    # the small filter's transpose is bound by DRAM's ramp for small transfers instead
    filter_s = max(2 * weight / rate, profile.memory_time(gpu.memory_bandwidth, 2 * weight))
    assert filter_s > 2 * weight / rate
    assert fwd.layout_s == pytest.approx(2 * act / rate + filter_s, rel=1e-9) and fwd_cl.layout_s == 0.0
    assert fwd.kernels - fwd_cl.kernels == 2
    analysis = analyze(Block(), torch.randn(32, 64, 56, 56), train=True, optimizer="none", amp="fp16")
    ops = {(t.module, t.phase): t for t in predict_analysis(analysis, gpu).step.ops if t.category == "conv"}
    assert ops[("pw", "forward")].kernels == 1 and ops[("pw", "forward")].layout_s == 0.0
    assert ops[("pw", "backward")].kernels > 2  # its gradients keep theirs: not measured
