"""``--pointwise fused`` (passes.fusion): the pointwise ops of a repeated block between two other
kernels run as one kernel over the bytes entering and leaving the group. Costs: small CPU
traces (~5 s)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nnperf.analysis import analyze
from nnperf.errors import UsageError
from nnperf.hardware import load_gpu
from nnperf.hardware.profile import default_profile
from nnperf.passes.fusion import extent_bytes, fused_groups
from nnperf.prediction import predict
from nnperf.trace.events import TensorMeta

B, H = 64, 256
H100 = load_gpu("h100")


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(H, H), nn.Linear(H, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x) * 2 + 1))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(), Block()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def _analysis(pointwise: str):
    return analyze(Net(), inputs=(torch.randn(B, H),), optimizer="sgd", pointwise=pointwise)


def test_a_blocks_pointwise_run_reads_its_input_and_writes_what_leaves_it():
    """Forward, between the two linears: x * 2, + 1, relu. The group reads a's output once and
    writes relu's output once (the second linear and relu's backward read it); the product and
    the sum never leave the group. By hand: 2 x B x H fp32 elements."""
    a = _analysis("fused")
    groups = fused_groups(a.trace, a.ops)
    forward = {g.members: g for g in groups.values()
               if a.trace.events[g.first].phase == "forward"}
    assert len(forward) == 2  # one per block
    by_index = {c.index: c for c in a.ops}
    for members, group in forward.items():
        assert [by_index[i].op.split(".")[-1] for i in members] == ["mul", "add", "relu"]
        assert (group.read_bytes, group.write_bytes) == (B * H * 4, B * H * 4)
    assert fused_groups(_analysis("eager").trace, _analysis("eager").ops) == {}


def test_the_group_is_one_kernel_at_the_achievable_bandwidth_and_the_rest_is_unchanged():
    fused, eager = predict(_analysis("fused"), H100), predict(_analysis("eager"), H100)
    profile = default_profile(H100)
    a = _analysis("fused")
    groups = fused_groups(a.trace, a.ops)
    for t in fused.step.ops:
        group = groups.get(t.index)
        if group is None:
            continue
        if t.index == group.first:
            assert t.kernels == 1 and t.fused_ops == len(group.members)
            expected = max(profile.memory_time(H100.memory_bandwidth, group.bytes),
                           group.flops / (H100.peak_flops("fp32", tensor_cores=False) * profile.cuda_core_fraction))
            assert t.kernel_s == pytest.approx(expected + profile.kernel_overhead_s)
        else:
            assert t.kernels == 0 and t.kernel_s == 0.0
    outside = [t.kernel_s for t in fused.step.ops if t.index not in groups]
    assert outside == [t.kernel_s for t in eager.step.ops if t.index not in groups]
    assert fused.step.step_s < eager.step.step_s


def test_a_broadcast_dimension_is_read_once():
    expanded = TensorMeta(storage=1, shape=(8, 16, 32), dtype=torch.bfloat16, stride=(0, 32, 1))
    assert extent_bytes(expanded) == 16 * 32 * 2


def test_a_model_without_repeated_blocks_is_refused():
    with pytest.raises(UsageError, match="--pointwise fused fuses the pointwise ops inside the repeated blocks"):
        analyze(nn.Sequential(nn.Linear(H, H), nn.ReLU()), inputs=(torch.randn(B, H),), pointwise="fused")
