"""What ``--pointwise fused`` keeps for backward (passes.memory.fused): a fused kernel saves what
enters it and what leaves it for another kernel, not its insides. Checked by hand on a block of
an RMS-style norm and a gated unit, fp32, B x H activations. Costs: small CPU traces (~5 s)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from test_fusion import Net  # two blocks in a ModuleList: the repeated blocks fusion works in
from torch import nn

from nnperf.analysis import analyze
from nnperf.hardware import load_gpu
from nnperf.prediction import predict

B, H = 64, 256
H100 = load_gpu("h100")


class NormGluBlock(nn.Module):
    """n = x * rsqrt(mean(x^2) + eps) * w; b(silu(a n) * c n)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(H, H), nn.Linear(H, H), nn.Linear(H, H)
        self.w = nn.Parameter(torch.ones(H))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w
        return self.b(F.silu(self.a(n)) * self.c(n))


def _saved(pointwise: str) -> int:
    torch.manual_seed(0)
    analysis = analyze(Net(NormGluBlock), inputs=(torch.randn(B, H),), optimizer="sgd", pointwise=pointwise)
    return sum(predict(analysis, H100).memory.saved_activations.values())


def test_a_fused_kernel_keeps_what_enters_and_leaves_it():
    """Eager, each block keeps for backward: x * r (B x H, for the product with w), silu's
    output (B x H, for the gate's product), and in the second block rsqrt's output r (B x 1:
    the first block's input needs no gradient, so neither does r there), besides what the
    linears read. Fused, the norm's insides and silu's output are recomputed from x and a's
    output, which are kept anyway (x by the norm's first product, a's output by silu):
    2 x 2 x B x H + B fp32 elements fewer."""
    assert _saved("eager") - _saved("fused") == (2 * 2 * B * H + B) * 4


class ExpBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(H, H), nn.Linear(H, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.exp(self.a(x)) * 2)


def test_what_the_recomputation_reads_is_kept_in_its_place():
    """exp keeps its output for backward, not its input. Fused, exp's output is recomputed in
    backward from a's output, which eager frees in forward: the fused step keeps a's output
    instead of exp's, the same bytes."""
    from nnperf.passes.memory.fused import fused_releases
    from nnperf.passes.memory.model import classify
    from nnperf.vocab import MemoryCategory

    torch.manual_seed(0)
    analysis = analyze(Net(ExpBlock), inputs=(torch.randn(B, H),), optimizer="sgd", pointwise="fused")
    trace = analysis.trace

    def saved(releases: dict) -> set[tuple[str, str]]:
        roles = classify(trace, releases=releases)
        return {(trace.events[trace.storages[s].created_by].name, r.module) for s, r in roles.items()
                if r.category == MemoryCategory.SAVED_ACTIVATIONS and r.module.startswith("layers.")}

    eager, fused = saved({}), saved(fused_releases(trace, analysis.ops))
    for block in ("layers.0", "layers.1"):
        assert ("aten.exp", block) in eager and ("aten.exp", block) not in fused
        assert ("aten.addmm", f"{block}.a") not in eager and ("aten.addmm", f"{block}.a") in fused


class Rms(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class CheckpointedResidualBlock(nn.Module):
    """h = x + a(n(x)); h + b(n(h)), n an RMS-style norm, recomputed in backward
    (torch.utils.checkpoint), as a pre-norm transformer block: its residual adds, which fused
    kernels take in, make the block's output, the next block's saved input, which only
    pointwise ops (its norm and residual add) read in forward."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(H, H), nn.Linear(H, H)
        self.n1, self.n2 = Rms(), Rms()

    def _inner(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.a(self.n1(x))
        return h + self.b(self.n2(h))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.utils.checkpoint.checkpoint(self._inner, x, use_reentrant=False)


def test_a_checkpointed_blocks_input_is_kept_as_itself():
    """Checkpointed, a block keeps its input alone; the second block's input is the first
    block's residual sum, a fused kernel's output that only fused ops read in forward.
    torch.utils.checkpoint keeps it as it is for the recomputation, so fused keeps what eager
    keeps, B x H fp32 a block (the first's output; the second's, which the loss reads), not the
    sum's sources in its place (a's and b's outputs: twice the bytes)."""
    torch.manual_seed(0)
    net = Net(CheckpointedResidualBlock)
    saved = {}
    for pointwise in ("eager", "fused"):
        analysis = analyze(net, inputs=(torch.randn(B, H),), optimizer="sgd", pointwise=pointwise)
        memory = predict(analysis, H100).memory.saved_activations
        saved[pointwise] = {k: v for k, v in memory.items() if k.startswith("layers.")}
    assert saved["eager"] == {"layers.0": B * H * 4, "layers.1": B * H * 4}
    assert saved["fused"] == saved["eager"]
