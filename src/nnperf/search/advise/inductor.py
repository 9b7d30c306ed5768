"""``torch.compile``: a model of what inductor fuses (``passes.fusion``'s runs and bytes).

Inductor turns each chain of pointwise, reduction and normalization ops between two matrix
ops (GEMMs, convolutions, attention) into one generated kernel that reads the chain's
inputs once and writes only what is used after the chain (by a later op, or saved for
backward); the intermediates never reach memory. Matrix ops stay library calls
(``extern_kernels.mm``) and inductor pads their misaligned dimensions. Views cost nothing in
the compiled region. The fused kernels are timed by the streaming model (bytes at the
achievable bandwidth, one launch each), the step by the same eager timeline.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nnperf.passes.costs import registry as cat
from nnperf.passes.count import OpCount
from nnperf.passes.fusion import DataFlow, fusable_runs, run_bytes
from nnperf.search.advise.change import Candidate, Change
from nnperf.search.advise.padding import families
from nnperf.search.advise.rewrite import Rewritten, rebuild
from nnperf.trace.events import OpEvent, Trace

if TYPE_CHECKING:
    from nnperf.search.advise.evaluate import Base

#: Phases inside the compiled region (the model's forward and its AOT backward). The loss
#: outside the model and the optimizer step are not compiled by ``torch.compile(model)``.
COMPILED_PHASES = ("forward", "backward")


def candidates(base: Base) -> list[Candidate]:
    return _compile_loss(base) + _compile_model(base)


def _compile_loss(base: Base) -> list[Candidate]:
    """The loss compiled (``--loss compiled``): a re-trace, whose memory is predicted too (what
    the compiled cross entropy keeps for backward is inductor's, not an fp32 log-softmax)."""
    step = base.options.trace
    if not step.train or step.loss != "eager":
        return []
    if not base.analysis.trace.config.get("loss_cross_entropy_calls"):
        return []  # no F.cross_entropy in the loss function: compiling it changes nothing nnperf models
    return [Candidate(
        name="compile-loss", family="compile",
        title="torch.compile the loss: cross entropy as one fused kernel each way",
        change=Change(trace=(("loss", "compiled"),)),
        how='loss_fn = torch.compile(loss_fn)   (torchtitan: [compile] components = ["loss"]; '
            "nnperf: --loss compiled)",
        layers=["(loss)"],
        assumptions=["every F.cross_entropy of the loss function runs as inductor's kernels: one read of the "
                     "logits forward, one read and one write backward; kept for backward: the logits in their "
                     "dtype and two fp32 numbers per row (inductor's partitioner), no fp32 log-softmax",
                     "compile time not counted"],
    )]


def _compile_model(base: Base) -> list[Candidate]:
    if base.options.trace.pointwise != "eager":
        base.checked.append(("torch-compile", "the step's pointwise ops already run fused (--pointwise fused)"))
        return []
    chains = fusion_chains(base.analysis.trace, base.analysis.ops)
    if not chains:
        base.checked.append(("torch-compile", "no chain of two or more pointwise/reduction ops to fuse"))
        return []
    ops = sum(len(c) for c in chains)
    pad = tuple(sorted(d for dims in families(base).values() for d in dims.items()))
    return [Candidate(
        name="torch-compile", family="compile",
        title=f"torch.compile: {ops} pointwise/reduction ops fused into {len(chains)} kernels",
        change=Change(fuse=True, pad=pad),
        how="model = torch.compile(model)",
        layers=sorted({c[0].module for c in chains if c[0].module})[:8],
        assumptions=[
            "each chain of pointwise/reduction/norm ops between two matrix ops in one phase becomes "
            "one kernel reading the chain's inputs once and writing what is read after it",
            "matrix ops are unchanged library kernels, their misaligned dimensions padded by inductor",
            "the loss outside the model and the optimizer step are not compiled; compile time not counted",
            "peak memory is not re-predicted (fusion usually lowers it: fewer intermediates saved)",
        ],
        extra={"fused_ops": ops, "kernels": len(chains)},
    )]


def fusion_chains(trace: Trace, counts: list[OpCount]) -> list[list[OpCount]]:
    """Runs of two or more fusible ops of one phase in the compiled region (the model's
    forward and backward, not the loss or the optimizer), in trace order
    (``passes.fusion.fusable_runs``; gradients' accumulation stays the autograd engine's)."""
    def region(c: OpCount) -> str | None:
        return c.phase if c.phase in COMPILED_PHASES and c.module not in ("(loss)", "") else None

    return fusable_runs(trace, counts, region)


def rewrite(rw: Rewritten) -> None:
    """Replace each chain by one fused kernel (its external reads and its live writes:
    ``passes.fusion.run_bytes``)."""
    flow = DataFlow(rw.trace, rw.counts)
    edits: dict[int, list[OpCount]] = {}
    drop: set[int] = set()
    for chain in fusion_chains(rw.trace, rw.counts):
        edits.update(_fuse(chain, flow))
    for ev in rw.trace.events:  # views in the compiled region
        if ev.free and ev.phase in COMPILED_PHASES and ev.module not in ("(loss)", ""):
            drop.add(ev.index)
    rw.trace, rw.counts = rebuild(rw.trace, rw.counts, edits, drop)


def _fuse(chain: list[OpCount], flow: DataFlow) -> dict[int, list[OpCount]]:
    reads, writes = run_bytes(chain, flow)
    first = chain[0]
    ev = OpEvent(index=first.index, func=_FUSED, args=(), kwargs={}, inputs=[], outputs=[],
                 phase=first.phase, module=first.module, block_call=first.event.block_call)
    category = cat.REDUCTION if any(c.category in (cat.REDUCTION, cat.NORM) for c in chain) else cat.ELEMENTWISE
    fused = OpCount(event=ev, category=category, flops=sum(c.flops for c in chain), macs=0.0,
                    bytes_in=reads, bytes_weights=0.0, bytes_out=writes, covered=True, info={"fused_ops": len(chain)})
    out = {first.index: [fused]}
    for c in chain[1:]:
        out[c.index] = []
    return out


class _Fused:
    """The name a fused kernel's event reports (``op_name`` falls back to ``str``)."""

    def __str__(self) -> str:
        return "inductor.fused"


_FUSED = _Fused()
