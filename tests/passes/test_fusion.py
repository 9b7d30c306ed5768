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
from nnperf.passes.fusion import fused_groups
from nnperf.prediction import predict

B, H = 64, 256
H100 = load_gpu("h100")


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(H, H), nn.Linear(H, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x) * 2 + 1))


class GatedBlock(nn.Module):
    """Two halves of one projection, as a fused gate/up projection feeds SwiGLU."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(H, 2 * H), nn.Linear(H, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.a(x).chunk(2, dim=-1)
        return self.b(torch.nn.functional.silu(gate) * up)


class Net(nn.Module):
    def __init__(self, block: type[nn.Module] = Block) -> None:
        super().__init__()
        self.layers = nn.ModuleList([block(), block()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def _analysis(pointwise: str, block: type[nn.Module] = Block):
    return analyze(Net(block), inputs=(torch.randn(B, H),), optimizer="sgd", pointwise=pointwise)


def _forward_groups(a) -> list:  # type: ignore[no-untyped-def]
    groups = {g.members: g for g in fused_groups(a.trace, a.ops).values()}
    return [g for g in groups.values() if a.trace.events[g.first].phase == "forward"]


def test_a_blocks_pointwise_run_reads_its_input_and_writes_what_leaves_it():
    """Forward, between the two linears: x * 2, + 1, relu. The group reads a's output once and
    writes relu's output once (the second linear and relu's backward read it); the product and
    the sum never leave the group. By hand: 2 x B x H fp32 elements."""
    a = _analysis("fused")
    forward = _forward_groups(a)
    assert len(forward) == 2  # one per block
    by_index = {c.index: c for c in a.ops}
    for group in forward:
        assert [by_index[i].op.split(".")[-1] for i in group.members] == ["mul", "add", "relu"]
        assert (group.read_bytes, group.write_bytes) == (B * H * 4, B * H * 4)
    eager = _analysis("eager")
    assert fused_groups(eager.trace, eager.ops) == {}


def test_two_halves_of_one_tensor_are_two_reads():
    """silu(gate) * up over the two halves of one projection: the group reads both halves
    (2 x B x H), and writes the product and silu's output, which the multiply's backward reads
    (2 x B x H); fp32."""
    for group in _forward_groups(_analysis("fused", GatedBlock)):
        assert (group.read_bytes, group.write_bytes) == (2 * B * H * 4, 2 * B * H * 4)


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


def test_a_model_without_repeated_blocks_is_refused():
    with pytest.raises(UsageError, match="--pointwise fused fuses the pointwise ops inside the repeated blocks"):
        analyze(nn.Sequential(nn.Linear(H, H), nn.ReLU()), inputs=(torch.randn(B, H),), pointwise="fused")
