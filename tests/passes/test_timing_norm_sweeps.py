"""A normalization's second sweep (passes.costs.norms.second_reads) costs DRAM bytes only when
its first sweep overflows the L2. Expected times are worked out from the tensor sizes and the
profile's bandwidth curve, not read from nnperf's output."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nnperf.analysis import analyze
from nnperf.hardware import default_profile, load_gpu
from nnperf.prediction import predict_analysis

C = 8


class Squared(nn.Module):
    """bn(x) ** 2 summed: batch norm's backward gets a full output gradient (a bare module's
    summed output would hand it one broadcast element)."""

    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn(x)
        return y * y


def _bn_ops(spatial: int) -> tuple[dict, int, object]:
    """The training step of one BatchNorm2d over (4, C, spatial, spatial) fp32 in channels-last
    on an RTX 3090 (6 MiB L2, no reuse measurement): its forward and backward OpTimes and the
    input's bytes. cuDNN streams channels-last tensors (in NCHW its training kernels are
    per-channel loops: ``kernels.batch_norm``)."""
    gpu = load_gpu("rtx-3090")
    analysis = analyze(Squared(), torch.randn(4, C, spatial, spatial, requires_grad=True), train=True, optimizer="none",
                       channels_last=True)
    ops = {t.op: t for t in predict_analysis(analysis, gpu).step.ops if "batch_norm" in t.op}
    return ops, 4 * C * spatial * spatial * 4, gpu


def test_an_input_larger_than_the_l2_is_read_from_dram_twice():
    ops, x_bytes, gpu = _bn_ops(512)  # 32 MiB > 6 MiB
    assert gpu.l2_reuse is None and x_bytes > gpu.l2_mb * 2**20
    profile = default_profile(gpu)
    fwd, bwd = ops["aten.native_batch_norm"], ops["aten.native_batch_norm_backward"]
    # forward: x read for the statistics, x read again and y written, + per-channel vectors
    small = fwd.count.bytes - 2 * x_bytes
    assert 0 < small < 1024
    assert fwd.model_memory_s == pytest.approx(profile.memory_time(gpu.memory_bandwidth, 3 * x_bytes + small))
    # backward: dy and x read twice, dx written
    small = bwd.count.bytes - 3 * x_bytes
    assert 0 < small < 1024
    assert bwd.model_memory_s == pytest.approx(profile.memory_time(gpu.memory_bandwidth, 5 * x_bytes + small))


def test_an_input_the_l2_holds_is_read_from_dram_once():
    ops, x_bytes, gpu = _bn_ops(64)  # 512 KiB: the second sweep finds it in L2
    assert 2 * x_bytes < gpu.l2_mb * 2**20  # backward's first sweep: dy and x
    profile = default_profile(gpu)
    for op in ("aten.native_batch_norm", "aten.native_batch_norm_backward"):
        t = ops[op]
        assert t.model_memory_s == pytest.approx(profile.memory_time(gpu.memory_bandwidth, t.count.bytes))
