"""Pointwise fusion inside a model's repeated blocks (``TraceOptions.pointwise == "fused"``).

torch.compile of each transformer block (torchtitan's ``[compile] components = ["model"]``)
lowers the pointwise, reduction and normalization ops that run between two kernels of another
kind (GEMMs, attention, collectives) into fused kernels that read what enters the group once
and write what leaves it; Transformer Engine's layers and Megatron-Core's fusions do the same
by hand for the same groups (RMSNorm, RoPE, SwiGLU, bias-dropout-add). Modelled here, from the
trace's data flow alone: in trace order, within one block and one phase, each maximal run of
two or more such ops with no other kernel between them is one group, timed as one kernel
(``passes.timing.KernelModel.fused_group``) over its external bytes: each storage the group
reads that none of its ops wrote (read once), and each storage it writes that an op after it
outside the group reads (written once; what backward keeps is read there). An op of no
kernel (an allocation) does not end a run.

Not modelled: a fusion across a GEMM the group does not depend on (``silu(w1 x) * w3 x``
stays two groups), activation memory that fusion no longer keeps (memory is the eager
step's), and a compiled region's one host launch for its GEMMs (each keeps its dispatch;
a group costs its first op's).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from nnperf.passes.costs import registry as cat
from nnperf.passes.count import OpCount
from nnperf.trace.events import TensorMeta, Trace

#: The op categories a fused kernel takes in.
FUSABLE = frozenset({cat.ELEMENTWISE, cat.REDUCTION, cat.NORM, cat.MEMORY})
#: Categories that launch no kernel on the compute stream: they do not end a run.
NO_KERNEL = frozenset({cat.ALLOC, cat.HOST})


@dataclass(frozen=True, slots=True)
class FusedGroup:
    """Ops of one block and phase run as one kernel: their event indices in trace order, the
    bytes the kernel reads and writes, and the FLOPs of its ops."""

    members: tuple[int, ...]
    read_bytes: int
    write_bytes: int
    flops: float

    @property
    def first(self) -> int:
        return self.members[0]

    @property
    def bytes(self) -> int:
        return self.read_bytes + self.write_bytes


def fused_groups(trace: Trace, counts: Sequence[OpCount]) -> dict[int, FusedGroup]:
    """Each fused op's group, by its event index: empty unless the trace names the blocks whose
    pointwise ops run fused (``config["fused_blocks"]``)."""
    blocks = tuple(trace.config.get("fused_blocks", ()))
    if not blocks:
        return {}
    runs = _runs(counts, _block_of(blocks))
    consumers: dict[int, list[int]] = defaultdict(list)
    producer: dict[int, int] = {}
    for event in trace.events:
        if event.free:
            continue
        for meta in event.inputs:
            consumers[meta.storage].append(event.index)
        for meta in event.outputs:
            producer.setdefault(meta.storage, event.index)
    groups: dict[int, FusedGroup] = {}
    for run in runs:
        group = _group(run, consumers, producer)
        for index in group.members:
            groups[index] = group
    return groups


def _block_of(blocks: tuple[str, ...]):
    """module name -> the block it runs in ("" outside every block), cached."""
    cache: dict[str, str] = {}

    def block(module: str) -> str:
        if module not in cache:
            inside = [b for b in blocks if module == b or module.startswith(b + ".")]
            cache[module] = max(inside, key=len, default="")
        return cache[module]

    return block


def _runs(counts: Sequence[OpCount], block_of) -> list[list[OpCount]]:
    """The maximal runs of fusable ops of one block and phase, two ops or more."""
    runs: list[list[OpCount]] = []
    current: list[OpCount] = []
    key: tuple[str, str] | None = None
    for count in counts:
        if count.category in NO_KERNEL:
            continue
        block = block_of(count.module or "")
        here = (block, count.phase)
        if count.category in FUSABLE and block:
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


def extent_bytes(meta: TensorMeta) -> int:
    """The bytes a view's elements occupy: a broadcast dimension (stride 0, as ``expand``
    makes) is read once, not once per index."""
    elements = 1
    for size, stride in zip(meta.shape, meta.stride, strict=True):
        if stride != 0:
            elements *= size
    return elements * meta.itemsize


def _group(run: list[OpCount], consumers: dict[int, list[int]], producer: dict[int, int]) -> FusedGroup:
    members = tuple(c.index for c in run)
    inside = set(members)
    reads: dict[int, int] = {}
    writes: dict[int, int] = {}
    for count in run:
        for meta in count.event.inputs:
            if producer.get(meta.storage) not in inside:
                reads[meta.storage] = max(reads.get(meta.storage, 0), extent_bytes(meta))
        for meta in count.event.outputs:
            if any(i not in inside and i > members[0] for i in consumers.get(meta.storage, ())):
                writes[meta.storage] = max(writes.get(meta.storage, 0), extent_bytes(meta))
    return FusedGroup(members, sum(reads.values()), sum(writes.values()), sum(c.flops for c in run))
