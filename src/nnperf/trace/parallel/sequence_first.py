"""Megatron-LM's tensors are sequence-first: the copies a batch-first trace makes around its
sequence-parallel collectives are not Megatron-LM's.

Megatron-LM keeps a block's activations as [sequence, batch, hidden], so a rank's sequence
shard is a contiguous slice of the first dimension. Its sequence-parallel all-gather and
reduce-scatter (``_gather_along_first_dim`` and ``_reduce_scatter_along_first_dim`` in
megatron/core/tensor_parallel/mappings.py; Transformer Engine's ``gather_along_first_dim``
likewise) call ``all_gather_into_tensor`` / ``reduce_scatter_tensor`` on the tensor as it
is: the gathered shards are the sequence in order, the row-parallel GEMM's output is the
reduce-scatter's input, and the weight gradient's GEMM reads the output gradient and the
gathered input in the same token order. No copy.

The zoo's models are batch-first ([batch, sequence, hidden]) and the tracer runs DTensor's
``SequenceParallel``, whose functional collectives work along the first dimension only
(torch/distributed/_functional_collectives.py): an all-gather along the sequence is gathered
along the batch dimension, then chunked and concatenated along the sequence (a ``cat``
unless the micro-batch holds one sample, where a view does); a reduce-scatter along the
sequence first chunks its input along the sequence and concatenates the chunks along the
batch dimension (a ``cat`` always). And nnperf's own Megatron-LM linears
(``trace.parallel.sequence_shards``) reorder a multi-sample output gradient into the gathered
input's token order for the weight gradient (a ``clone``). Each copy moves a whole gathered
activation: at GPT-3 175B's width on 4 tensor-parallel ranks, two samples of 2048 tokens,
72 us apiece, eight to ten of them a block.

``batch_first_copies`` finds them in a traced step of a Megatron-LM layout with sequence
parallelism; the rank's tracer (``trace.distributed.trace_rank``) lists them as
``trace.config["not_copied"]``, and ``passes.count`` counts each as the allocation of its
buffer: no kernel, as the layout Megatron-LM runs has none. They stay in the step (the
overlap of a collective with the GEMM that feeds it follows its data through them) and their
buffers in the memory timeline, each for the instant between its copy and its collective (a
transient the size of one gathered activation; Megatron-LM has none).
"""

from __future__ import annotations

from nnperf.trace.collectives import Collective
from nnperf.trace.events import OpEvent, Trace

#: What a gathered activation's rearrangement dispatches as: DTensor's chunk-and-concatenate,
#: and the copy a reshape of a transposed gradient makes.
_CAT = "aten.cat"
_CLONE = "aten.clone"
_WEIGHT_GRADIENT_GEMMS = frozenset({"aten.mm", "aten.addmm"})


def batch_first_copies(trace: Trace, collectives: list[Collective], group: str) -> list[int]:
    """The event indices of ``trace``'s copies that only rearrange a batch-first tensor around
    a sequence-parallel collective over ``group`` (the tensor-parallel process group's name):
    a ``cat`` of chunks of a gathered activation, a ``cat`` whose result is a reduce-scatter's
    input, and a ``clone`` into (ranks, batch, sequence / ranks, features) that a weight
    gradient reads beside a gathered activation (module docstring)."""
    events = trace.events
    ranks = next((c.group_size for c in collectives if c.group == group), 0)
    gathered = {m.storage for c in collectives if c.kind == "all_gather" and c.group == group
                for m in events[c.index].outputs}
    scattered = {m.storage for c in collectives if c.kind == "reduce_scatter" and c.group == group
                 for m in events[c.index].inputs}
    beside_gathered: set[int] = set()  # what a weight gradient's GEMM reads with a gathered input
    for event in events:
        if event.name in _WEIGHT_GRADIENT_GEMMS and event.phase == "backward":
            storages = {m.storage for m in event.inputs}
            if storages & gathered:
                beside_gathered |= storages - gathered

    def rearranges(event: OpEvent) -> bool:
        if event.name == _CAT:  # chunks of a gathered activation, or a reduce-scatter's input
            return (all(m.storage in gathered for m in event.inputs)
                    or all(m.storage in scattered for m in event.outputs))
        return event.name == _CLONE and all(
            m.storage in beside_gathered and len(m.shape) == 4 and m.shape[0] == ranks for m in event.outputs)

    return [event.index for event in events if not event.free and event.outputs and rearranges(event)]


__all__ = ["batch_first_copies"]
