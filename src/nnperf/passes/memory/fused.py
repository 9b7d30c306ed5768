"""What fused pointwise kernels keep for backward (``--pointwise fused``).

A fused kernel saves for backward what enters it and recomputes, or never writes, what it
computes inside: Transformer Engine's RMSNorm and LayerNorm save their input and the
per-token statistics (``rmsnorm_fwd``: ``mu``/``rsigma``), its fused SwiGLU saves its input
(megatron/core/fusions/fused_bias_swiglu.py: ``ctx.save_for_backward(input)``), and
torch.compile's partitioner (AOTAutograd's ``min_cut_rematerialization_partition``, what
torchtitan's compiled blocks run) saves the cheapest cut, recomputing pointwise intermediates
from the inputs of the fused region. In the eager trace the same ops save their intermediates:
an RMSNorm its fp32 copy of the input and the normalized tensor, SwiGLU the SiLU output.

So, in the fused blocks (``config["fused_blocks"]``), a storage created in forward by an op a
fused kernel takes in (``passes.fusion.fused_ops``), read in forward only by such ops and kept
for backward, is released after its last forward reader instead; what its recomputation reads
from outside those ops (a GEMM's or a collective's output, the block's input) is kept as long
as it would have been kept (usually it already is: the GEMM after the norm saves its input).
The recomputation's own transient in backward is not counted. A checkpointed region's input
is the exception: torch.utils.checkpoint keeps it as it is for the region's recomputation (a
transformer block's output, made by a fused residual add and read in forward only by the next
block's norm and residual add, is the next block's saved input), so it stays where it is.
What recomputed ops read (``OpEvent.recomputed``) says so; the tracer marks the ops of
submodules that run their forward again in backward, so a region whose own code reads its
input before any submodule does (a norm written inline in the block's forward, not a module)
is missed and its input moved as before. Every block of nnperf's zoo first reads its input
through a norm module (GPT-2's ``ln_1``, Llama's ``attention_norm``, ViT's ``ln_1``) or a GEMM.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from nnperf.passes.count import OpCount
from nnperf.passes.fusion import NO_KERNEL, fused_ops
from nnperf.trace.events import Phase, Trace


def fused_releases(trace: Trace, counts: Sequence[OpCount]) -> dict[int, int | None]:
    """The storages whose release moves under fused pointwise kernels, with the event after
    which each is released (None: alive past the step)."""
    inside = fused_ops(trace, counts)
    if not inside:
        return {}
    events, storages = trace.events, trace.storages
    forward_readers: dict[int, list[int]] = defaultdict(list)
    # what recomputation reads: checkpointed regions' inputs and what selective checkpointing
    # cached, each kept as itself (see the module docstring); a view shares its storage, so the
    # counted ops (views are free) find them all
    read_by_recomputation: set[int] = set()
    for c in counts:
        if c.phase == Phase.FORWARD and c.category not in NO_KERNEL:
            for m in c.event.inputs:
                forward_readers[m.storage].append(c.index)
        elif c.event.recomputed:
            read_by_recomputation.update(m.storage for m in c.event.inputs)

    def inside_forward(sid: int) -> bool:
        creator = storages[sid].created_by
        return creator is not None and creator in inside and events[creator].phase == Phase.FORWARD

    def kept_for_backward(sid: int) -> bool:
        released = storages[sid].released_after
        return released is None or events[released].phase == Phase.BACKWARD

    sources: dict[int, frozenset[int]] = {}

    def sources_of(sid: int) -> frozenset[int]:
        """The storages from outside the fused ops that ``sid``'s recomputation reads."""
        if sid not in sources:
            found: set[int] = set()
            for m in events[storages[sid].created_by].inputs:
                if m.storage == sid or m.storage in trace.param_storages:
                    continue
                found |= sources_of(m.storage) if inside_forward(m.storage) else {m.storage}
            sources[sid] = frozenset(found)
        return sources[sid]

    moved: dict[int, int | None] = {}
    extended: dict[int, int | None] = {}
    for sid, info in storages.items():
        if not inside_forward(sid) or not kept_for_backward(sid) or sid in read_by_recomputation:
            continue
        readers = forward_readers.get(sid, [])
        if not all(r in inside for r in readers):
            continue  # a GEMM, attention or collective reads it: it is what leaves the kernel
        moved[sid] = max(readers, default=info.created_by)
        for source in sources_of(sid):
            extended[source] = _later(extended.get(source, storages[source].released_after), info.released_after)
    for source, release in extended.items():
        if source not in moved and release != storages[source].released_after:
            moved[source] = release
    return moved


def _later(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else max(a, b)
