"""Which of FSDP2's ops run on its all-gather copy-in stream.

``FSDPParamGroup.unshard`` calls ``foreach_all_gather`` with the streams
``FSDPCommContext.get_all_gather_streams`` picks: in forward and pre-backward (a synchronous
unshard: implicit forward prefetch, explicit backward prefetch) the copy-in stream and the
all-gather stream, which wait for no compute kernel; otherwise (torch's pipeline runtime asks
for ``unshard(async_op=True)`` in its ``UNSHARD`` actions, between the schedule's forwards and
backwards) the current stream for both. On the copy-in stream run ``fsdp.all_gather_copy_in``
(its CUDA kernel copies the shards into the rank's slice of the all-gather buffer) and, when a
parameter dtype is set (mixed precision), ``_get_param_all_gather_inputs``' foreach copy that
casts the shards into a flat low-precision buffer allocated just before: the copy-in's inputs.
Both are read from ``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py`` (torch 2.13).

The memory pass places these buffers in the copy-in stream's pool (``memory.model``); the
timeline runs these kernels on the all-gather's stream (``comm_timeline``)."""

from __future__ import annotations

import bisect

from nnperf.passes.costs.registry import written_args
from nnperf.trace.events import OpEvent, Trace

#: FSDP2's copy of the shards into its all-gather buffer.
ALL_GATHER_COPY_IN = "fsdp.all_gather_copy_in"


def implicit_copy_ins(trace: Trace) -> list[OpEvent]:
    """The ``fsdp.all_gather_copy_in`` events run on the copy-in stream: all of them without a
    pipeline schedule, and those inside one of its forwards or backwards with one."""
    actions = trace.config.get("pipeline_actions") or []
    in_action = sorted((start, end) for _, start, end in actions)

    def implicit(index: int) -> bool:
        at = bisect.bisect_right(in_action, (index, float("inf"))) - 1
        return not actions or (at >= 0 and in_action[at][0] <= index < in_action[at][1])

    return [e for e in trace.events if e.name == ALL_GATHER_COPY_IN and implicit(e.index)]


def copy_in_stream_events(trace: Trace) -> frozenset[int]:
    """Event indices of the kernels on the copy-in stream: each implicit copy-in, and the ops
    that write its inputs (``written_args``) between their allocation and it (the mixed-precision cast; inputs
    that are the shards themselves, without a parameter dtype, were allocated before the step)."""
    events: set[int] = set()
    for copy_in in implicit_copy_ins(trace):
        events.add(copy_in.index)
        for storage in {m.storage for m in copy_in.inputs}:
            created = trace.storages[storage].created_by
            if created is None:
                continue
            for e in trace.events[created + 1:copy_in.index]:
                if _writes(e, storage):
                    events.add(e.index)
    return frozenset(events)


def _writes(event: OpEvent, storage: int) -> bool:
    """Whether ``event`` writes ``storage`` by its schema's alias annotations (a higher-order op
    has no schema: it does not)."""
    return getattr(event.func, "_schema", None) is not None and any(
        m.storage == storage for m in written_args(event))
