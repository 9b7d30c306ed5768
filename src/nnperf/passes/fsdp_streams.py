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

The memory pass places these buffers in the copy-in stream's pool (``memory.model``).

Its collectives run on streams of its own too, one of each kind for the whole model (the root's
``FSDPCommContext``), whatever process group they use: ``foreach_all_gather`` issues an implicit
all-gather inside ``device_handle.stream(all_gather_stream)`` after
``all_gather_stream.wait_stream(all_gather_copy_in_stream)``, ``foreach_reduce`` a
reduce-scatter inside ``stream(reduce_scatter_stream)`` after
``reduce_scatter_stream.wait_stream(current_stream)``, and HSDP's all-reduce inside
``stream(all_reduce_stream)`` after it waited for the reduce-scatter stream; all with
``async_op=False``, which since torch 2.8 launches on the current stream (pytorch#150398) and
before made the current stream wait for the communicator's. Either way the gathers of the
expert mesh's groups queue behind the dense mesh's on one stream, as its reduce-scatters do,
where a stream per communicator alone would run them side by side. The NCCL communicator's
order holds as well: a group's all-gathers and reduce-scatters, on two of these streams, still
run one at a time (``comm_timeline`` keeps both). ``engine_streams`` gives the timeline each
kernel's and collective's stream, ``engine_waits`` the events FSDP2 makes a stream wait for
(``wait_event``): its gathers' rate limit in forward and prefetch distance in backward, and a
unit's reduction waiting for the reduce-scatter before it.

Not modelled: the kernels ``foreach_reduce`` runs on its reduce-scatter (or, under HSDP,
all-reduce) stream around the collective, a division of the reduce-scatter's input or output
where ``ReduceOp.AVG`` does not apply (fp16 gradients; bf16 and fp32 ones have none) and a cast
of the result to the parameter dtype: the timeline runs them on the compute stream, after the
reduce-scatter (they cannot be told from the pipeline schedule's ``scale_grads`` division of
the same gradients, which does run there); the root's pre-forward wait of the gather streams
for the compute stream, once per micro-batch (without a pipeline a traced micro-batch starts
with its first gather exposed, and accumulation repeats it, ``search.accumulation``; a pipeline
that reshards after forward, which the plan's search does not build, gathers again in each
forward unheld); a one-rank group's copy (``aten.copy_``), which is neither a copy-out nor a
reduction here."""

from __future__ import annotations

import bisect
from collections.abc import Mapping

from nnperf.passes.comm_timeline import SideStream
from nnperf.passes.costs.registry import written_args
from nnperf.trace.collectives import COLLECTIVES
from nnperf.trace.events import OpEvent, Trace
from nnperf.vocab import Phase

#: FSDP2's copy of the shards into its all-gather buffer.
ALL_GATHER_COPY_IN = "fsdp.all_gather_copy_in"
#: FSDP2's copy of a unit's gradients into its reduce-scatter input.
CHUNK_CAT = "fsdp.chunk_cat"
#: FSDP2's copy of a gathered buffer into the unsharded parameters, on the compute stream
#: (inputs: the gathered buffer, then the parameters it writes; ``split_with_sizes_copy``).
COPY_OUT = "fsdp.split_with_sizes_copy"
#: ``FSDPCommContext``'s streams: only the reduce-scatter stream waits for the compute stream.
COPY_IN_STREAM = SideStream("FSDP all-gather copy-in stream", waits_for_compute=False)
ALL_GATHER_STREAM = SideStream("FSDP all-gather stream", waits_for_compute=False)
REDUCE_SCATTER_STREAM = SideStream("FSDP reduce-scatter stream", waits_for_compute=True)
ALL_REDUCE_STREAM = SideStream("FSDP all-reduce stream", waits_for_compute=False)


def implicit_copy_ins(trace: Trace) -> list[OpEvent]:
    """The ``fsdp.all_gather_copy_in`` events run on the copy-in stream: all of them without a
    pipeline schedule, and those inside one of its forwards or backwards with one."""
    actions = trace.config.get("pipeline_actions") or []
    in_action = sorted((start, end) for _, start, end in actions)

    def implicit(index: int) -> bool:
        at = bisect.bisect_right(in_action, (index, float("inf"))) - 1
        return not actions or (at >= 0 and in_action[at][0] <= index < in_action[at][1])

    return [e for e in trace.events if e.name == ALL_GATHER_COPY_IN and implicit(e.index)]


def copy_in_stream_events(trace: Trace, copy_ins: list[OpEvent] | None = None) -> frozenset[int]:
    """Event indices of the kernels on the copy-in stream: each implicit copy-in, and the ops
    that write its inputs (``written_args``) between their allocation and it (the mixed-precision cast; inputs
    that are the shards themselves, without a parameter dtype, were allocated before the step).
    ``copy_ins``: ``implicit_copy_ins(trace)`` where the caller has them already."""
    events: set[int] = set()
    for copy_in in implicit_copy_ins(trace) if copy_ins is None else copy_ins:
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


def engine_streams(trace: Trace) -> dict[int, SideStream]:
    """Event index -> its ``FSDPCommContext`` stream: the kernels of ``copy_in_stream_events``,
    the all-gathers of what an implicit copy-in filled, the reduce-scatters of a
    ``fsdp.chunk_cat``-filled input and the all-reduces of such a reduce-scatter's output (HSDP).
    The pipeline runtime's ``UNSHARD`` gathers are not among them (``async_op=True`` on the
    current stream: the communicator's own)."""
    copy_ins = implicit_copy_ins(trace)
    streams = dict.fromkeys(copy_in_stream_events(trace, copy_ins), COPY_IN_STREAM)
    buffers = {m.storage for e in copy_ins for m in e.outputs}
    reduce_inputs: set[int] = set()
    reduced: set[int] = set()
    for e in trace.events:
        storages = {m.storage for m in e.inputs}
        kind = COLLECTIVES.get(e.name, ("",))[0]
        if e.name == CHUNK_CAT and e.inputs:
            reduce_inputs.add(e.inputs[-1].storage)  # its ``out``
        elif kind == "all_gather" and storages & buffers:
            streams[e.index] = ALL_GATHER_STREAM
        elif kind == "reduce_scatter" and storages & reduce_inputs:
            streams[e.index] = REDUCE_SCATTER_STREAM
            reduced |= storages - reduce_inputs
        elif kind == "all_reduce" and storages & reduced:
            streams[e.index] = ALL_REDUCE_STREAM
    return streams


def engine_waits(trace: Trace, streams: Mapping[int, SideStream] | None = None) -> dict[int, int]:
    """Event index -> the earlier event whose end it waits for, by FSDP2's ``wait_event`` calls:

    - a gather (its copy-in stream's kernels and its all-gather) waits for a copy-out
      (``fsdp.split_with_sizes_copy``, on the compute stream): in forward for the one two units
      back (``wait_for_unshard`` makes both gather streams wait for the previous unit's copy-out
      after this unit's gather was issued: the rate limit of implicit prefetch), in backward for
      the last (``wait_for_unshard`` in pre-backward waits for this unit's copy-out before it
      prefetches the next: a prefetch runs one unit ahead);
    - a unit's ``fsdp.chunk_cat`` of its gradients into the reduce-scatter input (on the compute
      stream; it converts them to the reduce dtype in its kernel) waits for the reduce-scatter
      before it (``post_backward`` keeps ``reduce_scatter_max_input_buffers``, 1 by default, in
      flight).

    ``streams``: ``engine_streams(trace)`` where the caller has it already."""
    streams = engine_streams(trace) if streams is None else streams
    copy_outs: list[int] = []
    last_reduce: int | None = None
    waits: dict[int, int] = {}
    for e in trace.events:
        if e.name == COPY_OUT:
            copy_outs.append(e.index)
        elif streams.get(e.index) in (COPY_IN_STREAM, ALL_GATHER_STREAM):
            back = 1 if e.phase == Phase.BACKWARD else 2
            if len(copy_outs) >= back:
                waits[e.index] = copy_outs[-back]
        elif e.name == CHUNK_CAT and last_reduce is not None:
            waits[e.index] = last_reduce
        if streams.get(e.index) is REDUCE_SCATTER_STREAM:
            last_reduce = e.index
    return waits
