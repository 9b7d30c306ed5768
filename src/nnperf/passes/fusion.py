"""Pointwise fusion: runs of pointwise ops as one kernel over the bytes entering and leaving them.

torch.compile lowers the pointwise, reduction and normalization ops that run between two
kernels of another kind (GEMMs, attention, collectives) into fused kernels that read what
enters the run once and write what leaves it; Transformer Engine's layers and Megatron-Core's
fusions do the same by hand for the same runs (RMSNorm, RoPE, SwiGLU, bias-dropout-add). Two
users, one accounting (``run_bytes``):

- ``TraceOptions.pointwise == "fused"`` (``fused_groups``, timed by
  ``passes.timing.KernelModel.fused_group``): the runs inside the model's repeated blocks
  (``config["fused_blocks"]``: torchtitan compiles each block), within one phase and one
  pipeline action (a micro-batch's forward or backward of a stage, ``config["pipeline_actions"]``,
  which the plan times one by one), recomputed ops apart from the rest;
- advise's ``torch-compile`` candidate (``search.advise.inductor``): the runs anywhere in the
  compiled model.

A run is two or more such ops with no other kernel between them; an allocation (no kernel)
does not end it, a host op (a stream wait, a sync) does. An op that reads a parameter's
gradient (the autograd engine adding into ``.grad`` outside a compiled region, which
Megatron-Core fuses into the weight-gradient GEMM; a data-parallel engine copying it into its
bucket) or is FSDP2's own copy (``fsdp.*``) is not taken in; one that produces a gradient
(a norm's weight gradient) is.

Not modelled in time: a fusion across a GEMM the run does not depend on (``silu(w1 x) * w3 x``
stays two runs). Memory counts every op a fused kernel takes in as one kernel's insides,
whatever runs between them (``fused_ops``, read by ``passes.memory.fused``).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from nnperf.passes.costs import registry as cat
from nnperf.passes.count import OpCount
from nnperf.trace.events import KIND_GRAD, KIND_UNHELD_GRAD, Trace

#: The op categories a fused kernel takes in.
FUSABLE = frozenset({cat.ELEMENTWISE, cat.REDUCTION, cat.NORM, cat.MEMORY})
#: An op of this category launches no kernel and does not end a run.
NO_KERNEL = frozenset({cat.ALLOC})
#: FSDP2's copy-in and copy-out kernels (``fsdp.all_gather_copy_in``, ``fsdp.split_with_sizes_copy``).
ENGINE_NAMESPACES = ("fsdp.",)


@dataclass(frozen=True, slots=True)
class FusedGroup:
    """Ops run as one kernel: their event indices in trace order, the bytes the kernel reads
    and writes, and the FLOPs of its ops."""

    members: tuple[int, ...]
    read_bytes: float
    write_bytes: float
    flops: float

    @property
    def first(self) -> int:
        return self.members[0]

    @property
    def bytes(self) -> float:
        return self.read_bytes + self.write_bytes


class DataFlow:
    """Which ops read each storage, from the ops that launch kernels (views and allocations
    read nothing), and which storages live past the step."""

    def __init__(self, trace: Trace, counts: Sequence[OpCount]) -> None:
        self.consumers: dict[int, list[int]] = defaultdict(list)
        for c in counts:
            if c.category not in NO_KERNEL:
                for m in c.event.inputs:
                    self.consumers[m.storage].append(c.index)
        self.alive_at_end = {s for s, info in trace.storages.items() if info.released_after is None}

    def read_after(self, storage: int, index: int, inside: set[int]) -> bool:
        """Read by an op after ``index`` outside ``inside``, or alive at the end of the step."""
        return storage in self.alive_at_end or any(
            i not in inside and i > index for i in self.consumers.get(storage, ()))


def run_bytes(run: Sequence[OpCount], flow: DataFlow) -> tuple[float, float]:
    """(read, written) bytes of ``run`` as one kernel: each op's own counted bytes (a gather reads
    rows, not its whole table), kept for the share of its tensors that come from outside the run
    (each view of a storage once: two halves of one projection are two reads) and for the share
    of its outputs read after the run or alive at its end."""
    inside = {c.index for c in run}
    produced = {m.storage for c in run for m in c.event.outputs}
    seen: set[tuple] = set()
    reads = writes = 0.0
    last = run[-1].index
    for c in run:
        metas = c.event.inputs
        external = [m for m in metas if m.storage not in produced
                    and (m.storage, m.storage_offset, m.shape, m.stride) not in seen]
        seen.update((m.storage, m.storage_offset, m.shape, m.stride) for m in external)
        total = sum(m.nbytes for m in metas)
        if total:
            reads += (c.bytes_in + c.bytes_weights) * sum(m.nbytes for m in external) / total
        outs = c.event.outputs
        live = [m for m in outs if c.index == last or flow.read_after(m.storage, c.index, inside)]
        total = sum(m.nbytes for m in outs)
        if total:
            writes += c.bytes_out * sum(m.nbytes for m in live) / total
    return reads, writes


def fusable_runs(trace: Trace, counts: Sequence[OpCount],
                 region: Callable[[OpCount], object | None]) -> list[list[OpCount]]:
    """The runs of two or more fusable ops with one ``region`` (None: outside every fused
    region), in trace order, by the rules above."""
    takes_in = _taken_in(trace)
    runs: list[list[OpCount]] = []
    current: list[OpCount] = []
    key: object | None = None
    for count in counts:
        if count.category in NO_KERNEL:
            continue
        here = region(count)
        if here is not None and takes_in(count):
            if current and here == key:
                current.append(count)
                continue
            if len(current) > 1:
                runs.append(current)
            current, key = [count], here
        else:
            if len(current) > 1:
                runs.append(current)
            current, key = [], None
    if len(current) > 1:
        runs.append(current)
    return runs


def _taken_in(trace: Trace) -> Callable[[OpCount], bool]:
    """Whether a fused kernel may take an op in, by the rules above (its region apart)."""
    gradients = {s for s, info in trace.storages.items() if info.kind in (KIND_GRAD, KIND_UNHELD_GRAD)}

    def takes_in(count: OpCount) -> bool:
        return (count.category in FUSABLE and count.covered and not count.op.startswith(ENGINE_NAMESPACES)
                and not any(m.storage in gradients for m in count.event.inputs))

    return takes_in


def fused_ops(trace: Trace, counts: Sequence[OpCount]) -> set[int]:
    """The event indices of the ops inside the fused blocks (``config["fused_blocks"]``) that a
    fused kernel takes in, whatever kernels run between them: what ``passes.memory.fused``
    treats as one kernel's insides."""
    blocks = tuple(trace.config.get("fused_blocks", ()))
    if not blocks:
        return set()
    block_of, takes_in = _block_of(blocks), _taken_in(trace)
    return {c.index for c in counts if block_of(c.module or "") and c.category not in NO_KERNEL and takes_in(c)}


def fused_groups(trace: Trace, counts: Sequence[OpCount]) -> dict[int, FusedGroup]:
    """Each fused op's group, by its event index: empty unless the trace names the blocks whose
    pointwise ops run fused (``config["fused_blocks"]``)."""
    blocks = tuple(trace.config.get("fused_blocks", ()))
    if not blocks:
        return {}
    block_of = _block_of(blocks)
    action_of = _action_of(trace.config.get("pipeline_actions") or [])

    def region(c: OpCount) -> object | None:
        block = block_of(c.module or "")
        return (block, c.phase, action_of(c.index), c.event.recomputed) if block else None

    flow = DataFlow(trace, counts)
    groups: dict[int, FusedGroup] = {}
    for run in fusable_runs(trace, counts, region):
        reads, writes = run_bytes(run, flow)
        group = FusedGroup(tuple(c.index for c in run), reads, writes, sum(c.flops for c in run))
        for index in group.members:
            groups[index] = group
    return groups


def _block_of(blocks: tuple[str, ...]) -> Callable[[str], str]:
    """module name -> the block it runs in ("" outside every block), cached."""
    cache: dict[str, str] = {}

    def block(module: str) -> str:
        if module not in cache:
            inside = [b for b in blocks if module == b or module.startswith(b + ".")]
            cache[module] = max(inside, key=len, default="")
        return cache[module]

    return block


def _action_of(actions: Sequence[tuple[str, int, int]]) -> Callable[[int], int]:
    """event index -> the pipeline action it runs in (-1 outside every action)."""
    spans = sorted((start, end, n) for n, (_, start, end) in enumerate(actions))
    starts = [s for s, _, _ in spans]

    def action(index: int) -> int:
        at = bisect.bisect_right(starts, index) - 1
        return spans[at][2] if at >= 0 and index < spans[at][1] else -1

    return action
