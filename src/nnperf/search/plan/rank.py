"""One rank of a multi-GPU layout, traced and reduced to the numbers the plan composes.

``rank_cost`` traces one rank with the real engines (``trace.distributed.trace_rank``), times
it on the GPU (``prediction``) with its collectives on the cluster beside the compute
(``passes.comm_timeline``) and keeps numbers only: step, compute, communication, exposed time
per collective kind, host, optimizer, peak device memory, per-rank state bytes, collective
counts and bytes, model FLOPs, and for a pipeline rank the time of each schedule action (its
compute, exposed tensor-parallel communication and host, read off the replay's clock) with the
time before the first and after the last action.

Layer scaling (``scaled_cost``): a deep stack of identical blocks is traced with 3 and 4 blocks
per pipeline chunk and every number extrapolated linearly to the real depth, ``v(L) = v(3) +
(L - 3) (v(4) - v(3))``. Exact for what adds up per block: parameter, gradient and optimizer
bytes, collective counts and bytes, FLOPs, per-action compute; the step's timeline and host
time are affine in the depth once a block's neighbours are blocks; memory is extrapolated per
phase (forward, backward, optimizer: each phase's peak is affine, the step's peak is their
largest at the real depth) plus the allocator's and device's overhead of the deeper trace
(tests check the extrapolation against direct traces).
Ranks of the same role (the same trace) are traced once per search (``RoleCache``); ZeRO-1's
ranks hold even shares of every bucket, so one of them is every one's role.
"""

from __future__ import annotations

import bisect
import functools
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from nnperf.analysis import Analysis
from nnperf.hardware import GPU, DeviceProfile, default_profile
from nnperf.hardware.cluster import Cluster
from nnperf.hardware.host import load_host, with_host
from nnperf.kernels.collectives import (
    CollectiveEstimate,
    bus_factor,
    estimate_collective,
    group_tier,
)
from nnperf.kernels.expert_dispatch import estimate_deduplicated
from nnperf.layout import Execution
from nnperf.loading import resolve
from nnperf.passes.comm_timeline import Contention, overlap
from nnperf.passes.fsdp_streams import engine_streams, engine_waits
from nnperf.passes.memory.transfers import saved_transfers
from nnperf.prediction import predict_analysis
from nnperf.request import ModelRequest
from nnperf.search.accumulation import once_span
from nnperf.search.plan.expert_overlap import expert_overlap_saving
from nnperf.search.plan.results import RankCost, RankFigures, StateBytes
from nnperf.search.plan.states import param_row_bytes
from nnperf.trace.distributed import sharded_bytes, trace_rank
from nnperf.trace.events import Trace
from nnperf.trace.options import TraceOptions
from nnperf.trace.parallel.expert import routing_of
from nnperf.trace.step import once_per_step
from nnperf.vocab import Category, Phase

#: Traced blocks per chunk when a stack is scaled (two points of a line): from three blocks on,
#: each phase's memory peak and the timeline grow by the same amount per block (with fewer, the
#: embedding's and the head's tensors or a recomputed block's overlap the peak differently;
#: measured on a 70B-wide Llama under FSDP2 with and without full checkpointing).
SCALE_POINTS = (3, 4)

#: The collectives of DDP (all-reduces of the gradients' buckets; the broadcast of the module's
#: states from rank 0 when it wraps it) and of ZeRO-1 (their reduce-scatters and the
#: parameters' all-gathers), and the gradient norm's all-reduce of the clipping: what a
#: data-parallel engine runs over its group, never an all-to-all.
DATA_PARALLEL_KINDS = frozenset({"all_reduce", "reduce_scatter", "all_gather", "broadcast"})


Estimate = Callable[[Any, int], CollectiveEstimate]


def collective_estimator(cluster: Cluster, execution: Execution, routing: dict[str, tuple[int, int]]) -> Estimate:
    """How a collective of the trace is timed with ``nbytes``: as NCCL runs it
    (``kernels.collectives``), or, for a mixture of experts' all-to-alls under DeepEP
    (``Execution.token_dispatcher``), as DeepEP's kernels send a token once per node
    (``kernels.expert_dispatch``, with ``routing``: each MoE module's top-k and experts)."""
    def estimate(c: Any, nbytes: int) -> CollectiveEstimate:
        if execution.token_dispatcher == "deepep" and c.kind == "all_to_all":
            routed = next((geometry for module, geometry in routing.items()
                           if c.module == module or c.module.startswith(f"{module}.")), None)
            if routed is not None:
                return estimate_deduplicated(nbytes, c.group_ranks, cluster, *routed)
        return estimate_collective(c.kind, nbytes, c.group_ranks, cluster)
    return estimate


def collective_timer(estimate: Estimate, collectives: dict[int, Any], p2p_free: bool,
                     coalesced: frozenset[int] = frozenset()) -> Callable[[int], tuple[str, int, float]]:
    """Each collective's kind, bytes and time; the ``coalesced`` ones run as one, at the last
    of them, with all their bytes (``megatron_sequence_parallel_grads``)."""
    last = max(coalesced, default=None)
    together = sum(collectives[i].bytes for i in coalesced)

    def timed(index: int) -> tuple[str, int, float]:
        c = collectives[index]
        if p2p_free and c.kind == "send_recv":  # the pipeline replay times transfers itself
            return c.kind, c.bytes, 0.0
        if index in coalesced:
            seconds = estimate(c, together).time_s if index == last else 0.0
            return c.kind, c.bytes, seconds
        return c.kind, c.bytes, estimate(c, c.bytes).time_s
    return timed


def megatron_sequence_parallel_grads(execution: Execution, config: dict[str, Any],
                                     collectives: dict[int, Any]) -> frozenset[int]:
    """The all-reduces over the tensor-parallel group in backward of a Megatron-LM layout with
    sequence parallelism: the gradients of the parameters every tensor-parallel rank holds whole
    (the norms' weights and biases), which DTensor, the trace's stand-in, reduces one by one as
    each is made. Megatron-Core reduces them flattened into one buffer, one all-reduce
    (``finalize_model_grads``: ``_allreduce_layernorm_grads``, later
    ``_allreduce_non_tensor_model_parallel_grads``), once per step after the last micro-batch;
    the plan runs that one all-reduce per traced micro-batch, at the last of them (with several
    micro-batches, ``grad_accum - 1`` small all-reduces more than Megatron-LM runs)."""
    group = config.get("tensor_parallel_group")
    if group is None or not execution.megatron_sequence_parallel:
        return frozenset()
    return frozenset(c.index for c in collectives.values()
                     if c.kind == "all_reduce" and c.phase == "backward" and c.group == group)


def _contention(cluster: Cluster, gpu: GPU, collectives: dict[int, Any], estimate: Estimate,
                copied: Callable[[int], bool] | None = None) -> Callable[[int], Contention | None]:
    """What each collective takes from the compute kernels beside it: its tier's thread blocks
    out of the GPU's SMs, and twice its bus bandwidth (each byte it moves read once and written
    once) out of the DRAM bandwidth. None where the tier does not say its thread blocks.
    ``copied(index)``: the collective's chunks move by copy engine (torch's async tensor
    parallelism: ``copy_`` between symmetric-memory buffers), which takes the DRAM bandwidth
    and no SM."""
    def taken(index: int) -> Contention | None:
        c = collectives[index]
        ctas = group_tier(cluster, c.group_ranks).collective_ctas
        estimated = estimate(c, c.bytes)
        if ctas is None or not estimated.time_s:
            return None
        bus_bytes = c.bytes * bus_factor(c.kind, len(c.group_ranks))
        sm_share = 0.0 if copied is not None and copied(index) else ctas / gpu.sm_count
        return Contention(sm_share, 2 * bus_bytes / estimated.time_s / gpu.memory_bandwidth)
    return taken


#: Chunks of Transformer Engine's userbuffers overlap (``initialize_ub``'s defaults,
#: transformer_engine/pytorch/module/base.py): its ring exchange splits the all-gathers of
#: qkv_fprop, fc1_fprop, proj_dgrad and fc2_dgrad into one chunk per tensor-parallel rank, its
#: pipeline the reduce-scatters of proj_fprop and fc2_fprop into ``num_splits`` = 4.
PIPELINE_SPLITS = 4


def tensor_parallel_chunks(execution: Execution, trace: Trace,
                           collectives: dict[int, Any]) -> Callable[[int], int | None] | None:
    """The chunks each tensor-parallel collective runs in with its GEMM (``comm_timeline``):
    Megatron-LM's linear layers reduce-scatter an input gradient in one piece beside the weight
    gradient's GEMM (``LinearWithGradAccumulationAndAsyncCommunication``, and Transformer
    Engine's layers with or without userbuffers); with --tp-comm-overlap, Transformer Engine's
    userbuffers pipeline the blocks' forward all-gathers and reduce-scatters and backward
    all-gathers too (``PIPELINE_SPLITS``); the output layer is not Transformer Engine's.
    torch's async tensor parallelism: ``async_tensor_parallel_chunks``."""
    group = trace.config.get("tensor_parallel_group")
    if group is None:
        return None
    blocks = tuple(trace.config.get("blocks", ()))

    def in_block(c: Any) -> bool:
        return any(c.module == b or c.module.startswith(f"{b}.") for b in blocks)

    if execution.async_tp:
        return async_tensor_parallel_chunks(execution, trace, collectives, group, in_block)
    if not execution.megatron_sequence_parallel:
        return None

    def chunks(index: int) -> int | None:
        c = collectives[index]
        if c.group != group:
            return None
        if c.kind == "reduce_scatter" and c.phase == "backward":
            return 1
        if not execution.tp_comm_overlap or not in_block(c):
            return None
        if c.kind == "all_gather":
            return execution.tensor
        return PIPELINE_SPLITS if c.kind == "reduce_scatter" else None
    return chunks


def async_tensor_parallel_chunks(execution: Execution, trace: Trace, collectives: dict[int, Any], group: str,
                                 in_block: Callable[[Any], bool]) -> Callable[[int], int | None]:
    """torch's async tensor parallelism (``Execution.async_tp``): Inductor's micro-pipeline pass
    (torch/_inductor/fx_passes/micro_pipeline_tp.py) rewrites, in each compiled graph, an
    all-gather whose result is the left operand of matmuls into ``fused_all_gather_matmul``
    and a matmul whose one user is a reduce-scatter into ``fused_matmul_reduce_scatter``; both
    run in one chunk per tensor-parallel rank (torch/distributed/_symmetric_memory). So the
    blocks' all-gathers are pipelined (``passes.comm_timeline`` pairs one with the matmuls that
    read it first), and each reduce-scatter a matmul feeds (``fed_by_matmul``): forward's and
    recomputation's; in backward a row-parallel layer's output gradient is all-gathered for its
    input gradient's matmul, while the column-parallel layers' input gradients are
    reduce-scattered after their sum where several read one input (q, k and v's, w1 and w3's:
    an add between the matmuls and it, so not fused), fused where one does (GPT-2's c_attn and
    c_fc). Outside the compiled blocks (embedding, output layer) nothing is. Decided once per
    trace: the timeline and the contention ask for each collective again."""
    writers = storage_writers(trace)
    ours = [c for c in collectives.values() if c.group == group and in_block(c)]
    pipelined = {c.index: execution.tensor for c in ours
                 if c.kind == "all_gather" or (c.kind == "reduce_scatter" and fed_by_matmul(trace, c.index, writers))}
    return pipelined.get


#: The ops between a matmul and a reduce-scatter that Inductor's micro-pipeline pass matches
#: through: a reshape of the matmul's output (``_find_producer_matmul``: mm, or reshape(mm)), and
#: the split and cat DTensor's redistribution makes to scatter another dimension than the first
#: (``find_reduce_scatter_patterns``: reduce_scatter(cat(split(input, dim))))
_MOVES = frozenset({"aten.view", "aten._unsafe_view", "aten.reshape", "aten.split", "aten.split_with_sizes",
                    "aten.cat"})
#: The matmuls a fused reduce-scatter runs chunk by chunk (``aten.mm``; ``aten._scaled_mm``: float8).
_MATMULS = frozenset({"aten.mm", "aten._scaled_mm"})


def storage_writers(trace: Trace) -> dict[int, list[int]]:
    """Each storage's writers: the indices of the events that output it, in trace order."""
    writers: dict[int, list[int]] = defaultdict(list)
    for e in trace.events:
        for m in e.outputs:
            writers[m.storage].append(e.index)
    return writers


def fed_by_matmul(trace: Trace, index: int, writers: dict[int, list[int]]) -> bool:
    """Whether the collective at event ``index`` reduces what a matmul wrote, through the ops
    Inductor matches through (``_MOVES``): the reduce-scatter it fuses with its matmul. The
    latest writer of each storage read (``writers``: ``storage_writers``) is followed back, one
    op at a time."""
    events = trace.events
    storage = events[index].inputs[0].storage if events[index].inputs else None
    at = index
    while storage is not None:
        earlier = bisect.bisect_left(writers.get(storage, []), at)
        if earlier == 0:
            return False
        writer = events[writers[storage][earlier - 1]]
        if writer.name in _MATMULS:
            return True
        if writer.name not in _MOVES or not writer.inputs:
            return False
        storage, at = writer.inputs[0].storage, writer.index
    return False


def async_tensor_parallel_sums(execution: Execution, gpu: GPU, profile: DeviceProfile,
                               collectives: dict[int, Any]) -> Callable[[int], float] | None:
    """The sum the compute stream runs after each reduce-scatter torch's async tensor
    parallelism pipelines (``Execution.async_tp``): ``_fused_matmul_reduce_scatter_impl``
    (torch/distributed/_symmetric_memory) has each rank's matmul write one partial chunk per
    rank, copies them to their ranks, and sums a rank's ``tensor`` partial chunks with one
    reduction kernel once the last has arrived: it reads the whole reduce-scatter input (the
    partials, in the matmul's output dtype) and writes one chunk of it, a kernel bound by DRAM
    bandwidth, which NCCL's reduce-scatter does not leave to the compute stream (its kernels sum
    as they move). None where nothing is summed so."""
    if not execution.async_tp:
        return None

    def seconds(index: int) -> float:  # a pipelined reduce-scatter's (comm_timeline asks no other)
        moved = collectives[index].bytes * (1 + 1 / execution.tensor)
        return profile.memory_time(gpu.memory_bandwidth, moved)
    return seconds


def rank_profile(execution: Execution, gpu: GPU, host: str) -> DeviceProfile:
    """The device profile a rank of ``execution`` is priced with, its host costs those of the
    cluster's CPU (``host``, an id of ``hardware/hosts.toml``: ``Cluster.host``). Megatron-LM's
    tensor-parallel layers (Megatron-Core's ColumnParallelLinear and RowParallelLinear) run on
    plain tensors and call their collectives themselves, so a layout only Megatron-LM runs
    (``Execution.megatron_layout``) pays no DTensor dispatch on the host: the DTensor of the
    traced stand-in is the trace's means, not the run's cost (its ops are charged as plain ones)."""
    profile = with_host(default_profile(gpu), load_host(host))
    if not execution.megatron_layout:
        return profile
    return replace(profile, host_dtensor_dispatch_s=0.0, host_dtensor_list_tensor_s=0.0)


def rank_cost(request: ModelRequest, options: TraceOptions, execution: Execution, gpu: GPU,
              cluster: Cluster, rank: int = 0, prepare: Callable[[Any], Any] | None = None,
              units: Callable[[Any], list[str]] | None = None) -> RankCost:
    """Trace rank ``rank`` of ``execution`` for ``request`` (its batch: one rank's micro-batches)
    and reduce it to numbers."""
    from nnperf.trace.blocks import repeated_blocks

    name, build = resolve(request)
    traced = trace_rank(build, options, execution, units or repeated_blocks, prepare, rank=rank)
    analysis = Analysis.from_trace(name, options, traced.trace, traced.workload)
    profile = rank_profile(execution, gpu, cluster.host)
    prediction = predict_analysis(analysis, gpu, profile)
    by_index = {c.index: c for c in traced.collectives}
    pipelined = execution.pipeline > 1
    coalesced = megatron_sequence_parallel_grads(execution, traced.trace.config, by_index)
    moe_routing = routing_of(traced.workload.model)  # DeepEP's sends and the expert overlap's layers
    estimate = collective_estimator(cluster, execution, moe_routing if execution.token_dispatcher == "deepep" else {})
    chunks = tensor_parallel_chunks(execution, traced.trace, by_index)
    copied = (lambda index: chunks(index) is not None) if chunks is not None and execution.async_tp else None
    contention = _contention(cluster, gpu, by_index, estimate, copied)
    fsdp_streams = engine_streams(traced.trace)
    comm = overlap(prediction.step, traced.trace, collective_timer(estimate, by_index, pipelined, coalesced),
                   contention, stream_of=lambda index: by_index[index].stream, pipelined=chunks,
                   side_streams=fsdp_streams, event_waits=engine_waits(traced.trace, fsdp_streams),
                   reduced_after=async_tensor_parallel_sums(execution, gpu, profile, by_index))
    once = [t for t in prediction.step.ops if once_per_step(t.count.event)]
    attention = [t for t in prediction.step.ops if t.category == Category.ATTENTION]
    forward = [t.count.event for t in attention if t.phase == "forward"]
    memory = prediction.memory
    figures = RankFigures(
        step_s=comm.step_s, compute_s=comm.compute_s, comm_s=comm.comm_s, slowdown_s=comm.slowdown_s,
        host_s=prediction.step.host_s, host_busy_s=prediction.step.host_busy_s,
        optimizer_s=sum(t.kernel_s for t in once),
        optimizer_host_s=sum(t.host_s for t in once),
        recompute_s=sum(t.kernel_s for t in prediction.step.ops if t.count.event.recomputed),
        memory=float(memory.device_total or 0),
        flops=prediction.model_flops,
        once_span_s=once_span(prediction.step, comm),
        saved_activations=float(sum(memory.saved_activations.values())),
        loss_saved=float(memory.saved_activations.get("(loss)", 0)),
        attention_s=sum(t.kernel_s for t in attention),
        attention_forward_s=sum(t.kernel_s for t in attention if t.phase == "forward"),
        attention_recomputed_s=sum(t.kernel_s for t in attention if t.count.event.recomputed),
        attention_flops=float(sum(t.count.flops for t in attention  # the model's: MFU's numerator
                                  if t.phase in ("forward", "backward") and not t.count.event.recomputed)),
        attention_layers=float(len(forward)),
        kv_bytes=float(sum(e.inputs[1].nbytes + e.inputs[2].nbytes for e in forward if len(e.inputs) >= 3)),
        model_states=float(sum(memory.model_states.values())),
        param_row_bytes=param_row_bytes(traced.trace),
        exposed_s=dict(comm.exposed_s),
        states=StateBytes(**{k: float(v) for k, v in sharded_bytes(traced).items()}),
    )
    # what Megatron-Core's expert overlap would save (``Execution.expert_overlap`` decides
    # whether the plan takes it: the trace is the same either way)
    figures.expert_overlap_s = expert_overlap_saving(traced.trace, traced.collectives, comm, prediction.step.ops,
                                                     contention, list(moe_routing))
    _memory_by_phase(memory, figures)
    for c in traced.collectives:
        figures.collective_count[c.kind] = figures.collective_count.get(c.kind, 0.0) + 1
        figures.collective_bytes[c.kind] = figures.collective_bytes.get(c.kind, 0.0) + c.bytes
    config = traced.trace.config
    actions = config.get("pipeline_actions") or []
    # the data-parallel synchronization a pipeline runs once per step, whatever its
    # micro-batches (DDP's reduction in the last micro-batch's backward, ZeRO-1's and FSDP2's
    # parameter all-gathers before the first forward), and the reduction that DDP and ZeRO-1
    # accumulating without a pipeline run in the last micro-batch only (``no_sync`` before it;
    # from the first once-per-step op on, the step's tail holds it: ``once_span_s``)
    groups = config.get("data_parallel_groups", [])
    if actions:
        sync = _data_parallel_once(traced, comm, prediction.step, groups, by_index)
    elif execution.replicates_parameters and once:
        sync = _data_parallel_once(traced, comm, prediction.step, groups, by_index).before(once[0].index)
    else:  # FSDP2 reduce-scatters every micro-batch
        sync = _Sync()
    if not actions and once:
        figures.once_exposed_s = _waits_by_kind(comm, by_index, since=once[0].index)
    _set_sync(figures, sync)
    if actions:
        indices = sorted(comm.clock)
        clocks = [comm.clock[i] for i in indices]

        def clock_before(index: int) -> float:  # compute clock after the last event before ``index``
            at = bisect.bisect_left(indices, index)
            return clocks[at - 1] if at else 0.0

        # what the traced micro-batch spends on the once-per-step synchronization is the step's
        # head or tail, not every action's
        sync_parts = sync.at()
        sums: dict[str, list[float]] = {}
        head = tail = 0.0
        for label, start, end in actions:
            kind, stage = label[0], label.split("@")[1]
            waited = sum(w for index, w in sync_parts if start <= index < end)
            sums.setdefault(f"{kind}@{stage}", []).append(clock_before(end) - clock_before(start) - waited)
            if kind == "F":
                head += waited
            else:
                tail += waited
        figures.action_s = {k: sum(v) / len(v) for k, v in sums.items()}
        figures.head_s = clock_before(actions[0][1]) + head
        figures.tail_s = comm.step_s - clock_before(actions[-1][2]) + tail
        sends = [c for c in traced.collectives if c.kind == "send_recv" and c.phase == "forward"
                 and c.group_ranks[0] == rank]
        figures.p2p_bytes = float(max((c.bytes for c in sends), default=0))
        figures.transfers = saved_transfers(traced.trace, actions)
    workload = analysis.workload
    return RankCost(figures, prediction.mfu_peak.flops, (workload.tokens or workload.samples) or 0,
                    "tokens/s" if workload.tokens else "samples/s",
                    tuple(config.get("pipeline_stages", ())),
                    {int(k): v for k, v in (config.get("pipeline_order") or {}).items()}, rank=rank)


@dataclass(frozen=True)
class _Sync:
    """What the traced micro-batch spends on the data-parallel engine's once-per-step
    synchronization, each part at the event it lengthens: the compute stream's waits for those
    collectives (with the collective's kind), the kernels reading or writing their buffers, and
    what the collectives beside the compute kernels stretch them by (``Contention``)."""

    waits: list[tuple[int, str, float]] = field(default_factory=list)
    #: event index, the kernel's time, and the time it lengthens the timeline by (its kernel,
    #: or its dispatch where the host is behind)
    kernels: list[tuple[int, float, float]] = field(default_factory=list)
    slowed: list[tuple[int, float]] = field(default_factory=list)
    #: the collectives themselves: event index, duration
    collectives: list[tuple[int, float]] = field(default_factory=list)

    def at(self) -> list[tuple[int, float]]:
        """Every part as (event index, seconds it lengthens the timeline by)."""
        return [(i, s) for i, _, s in self.waits] + [(i, s) for i, _, s in self.kernels] + self.slowed

    def before(self, index: int) -> _Sync:
        """The parts at events before ``index``."""
        return _Sync([w for w in self.waits if w[0] < index], [k for k in self.kernels if k[0] < index],
                     [x for x in self.slowed if x[0] < index], [c for c in self.collectives if c[0] < index])


def _waits_by_kind(comm: Any, collectives: dict[int, Any], since: int) -> dict[str, float]:
    """The compute stream's waits at events from ``since`` on, by the kind of the collective
    waited for (``collectives``: by event index)."""
    waited: dict[str, float] = {}
    for index, collective, seconds in comm.waits:
        if index >= since:
            kind = collectives[collective].kind
            waited[kind] = waited.get(kind, 0.0) + seconds
    return waited


def _data_parallel_once(traced: Any, comm: Any, step: Any, groups: list[str], collectives: dict[int, Any]) -> _Sync:
    """What the traced micro-batch spends on the data-parallel engine's once-per-step
    synchronization over ``groups`` (process group names): the compute stream's waits for those
    collectives, the kernels reading or writing their buffers (DDP's copies of the gradients
    into its buckets and back, its division of a bucket: what micro-batches under no_sync
    skip), and the stretch of the compute kernels they run beside. Only the kinds such an
    engine issues (``DATA_PARALLEL_KINDS``): an expert group over the same ranks (expert
    parallelism over every data-parallel rank, both then the default group) runs its
    all-to-alls in every micro-batch."""
    names = set(groups)
    synchronizing = {c.index for c in traced.collectives if c.group in names and c.kind in DATA_PARALLEL_KINDS}
    if not synchronizing:
        return _Sync()
    # the gradients' buckets: what the reductions read (an all-gather's input is a parameter
    # buffer every kernel reads)
    reductions = {c.index for c in traced.collectives if c.index in synchronizing
                  and c.kind in ("all_reduce", "reduce_scatter")}
    buffers = {m.storage for index in reductions for m in traced.trace.events[index].inputs}
    # and the buckets a reduction's buffer is cast from (ZeRO-1's fp32 main gradients, filled from
    # DDP's 16-bit buckets once a step): what fills those is the same once-per-step work
    buffers |= {m.storage for e in traced.trace.events if e.phase == "backward" and e.name == "aten.copy_"
                and e.outputs and len(e.inputs) > 1 and e.outputs[0].storage in buffers
                and e.outputs[0].dtype != e.inputs[1].dtype
                for m in e.inputs[1:2]}
    # each op lengthens the timeline by its kernel, or by issuing it where the host is behind
    kernels = [(t.index, t.kernel_s, max(t.kernel_s, t.host_s)) for t in step.ops if t.index not in synchronizing
               and t.phase == "backward"
               and any(m.storage in buffers for m in (*t.count.event.inputs, *t.count.event.outputs))]
    waits = [(index, collectives[collective].kind, seconds) for index, collective, seconds in comm.waits
             if collective in synchronizing]
    slowed = [(index, seconds) for index, collective, seconds in comm.slowed if collective in synchronizing]
    durations = [(c.index, c.end_s - c.start_s) for c in comm.slices if c.index in synchronizing]
    return _Sync(waits, kernels, slowed, durations)


def _set_sync(figures: RankFigures, sync: _Sync) -> None:
    """``figures``' once-per-step synchronization figures (``RankFigures.sync_*``) from its parts."""
    for _, kind, seconds in sync.waits:
        figures.sync_exposed_s[kind] = figures.sync_exposed_s.get(kind, 0.0) + seconds
    figures.sync_kernel_s = sum(kernel for _, kernel, _ in sync.kernels)
    figures.sync_slowdown_s = sum(seconds for _, seconds in sync.slowed)
    figures.sync_comm_s = sum(seconds for _, seconds in sync.collectives)


def _memory_by_phase(report: Any, figures: RankFigures) -> None:
    """The highest allocated memory of each phase of the step, and what the device holds beyond
    it (allocator segments, CUDA context, workspaces): each phase's peak is affine in the depth
    of a stack of identical blocks, while the step's peak can move from one phase to another (an
    embedding gradient in backward of a shallow trace, the saved activations at the start of
    backward of a deep one), so depth is extrapolated per phase."""
    peaks = figures.memory_by_phase
    before_optimizer: float | None = None
    previous = 0.0
    for point in report.timeline:
        peaks[point.phase] = max(peaks.get(point.phase, 0.0), float(point.allocated))
        if point.phase == Phase.OPTIMIZER and before_optimizer is None:
            before_optimizer = previous
        previous = float(point.allocated)
    if before_optimizer is not None:
        figures.optimizer_rise = max(0.0, peaks[Phase.OPTIMIZER] - before_optimizer)
    if report.device_total is not None and report.peak_allocated is not None:
        figures.mem_outside = float(report.device_total - report.peak_allocated)
    if report.device_total is not None and report.peak_reserved is not None:
        figures.mem_context = float(report.device_total - report.peak_reserved)


def layers_of(request: ModelRequest) -> int | None:
    """The number of repeated blocks of a built-in model that has an ``n_layer`` option (the
    depth scaling applies to it); None for any other model (traced whole)."""
    if not isinstance(request.target, str) or ":" in request.target:
        return None
    from nnperf.zoo import get_model

    spec = get_model(request.target)
    if "n_layer" not in spec.options:
        return None
    if "n_layer" in request.overrides:  # checked as the model's build checks it, without building it
        from nnperf.zoo._options import positive_int

        return positive_int(request.target, "n_layer", request.overrides["n_layer"])
    import torch

    with torch.device("meta"):
        return int(spec.build(1, None, **request.overrides).info["config"]["n_layer"])


def extrapolate(low: RankCost, high: RankCost, k_low: int, k_high: int, k: int) -> RankCost:
    """The line through two traced depths (blocks per chunk), read at ``k``."""
    per_block = low.figures.combine(high.figures, lambda a, b: (b - a) / (k_high - k_low))
    figures = low.figures.combine(per_block, lambda a, slope: a + (k - k_low) * slope)
    # the allocator's segments beyond the allocated bytes do not add up per block: the larger
    figures.mem_outside = max(low.figures.mem_outside, high.figures.mem_outside)
    figures.mem_context = max(low.figures.mem_context, high.figures.mem_context)
    figures.step_s += _clamp_waits(figures)
    # each line is exact where the step's bound stays the same, but a host that falls behind
    # the device only in the deeper stack (its cost per block the larger) bends the step's
    # line: the step cannot end before the host has issued it or the device has run it
    figures.step_s = max(figures.step_s, figures.host_s, figures.compute_s)
    if figures.memory_by_phase:  # the step's peak: the highest phase at this depth
        figures.memory = max(figures.memory_by_phase.values()) + figures.mem_outside
    return replace(high, figures=figures, per_block=per_block)


def _clamp_waits(figures: RankFigures) -> float:
    """Stop each extrapolated wait of the compute stream at zero, and return the time the
    step's line lost below it. A wait need not grow with depth: a data-parallel bucket's
    gather, waited for at the first forward, hides behind more blocks the deeper the stack
    (4.8 ms at 3 blocks, 3.9 at 4 of a Llama 3.1 8B rank over 64 data-parallel ranks), and
    its line crosses zero (-19 ms at 32 blocks), taking from the step what no wait gave back.
    Each wait of a kind splits into the once-per-step synchronization's
    (``sync_exposed_s``), the once-per-step tail's (``once_exposed_s``) and every
    micro-batch's (the rest); each part stops at zero on its own, since a step of many
    micro-batches counts them differently (``RankFigures.exposed_over``)."""
    lost = 0.0
    exposed: dict[str, float] = {}
    # in the kinds' first-seen order, not a set's (string hashes differ between processes)
    for kind in dict.fromkeys([*figures.exposed_s, *figures.sync_exposed_s, *figures.once_exposed_s]):
        sync = figures.sync_exposed_s.get(kind, 0.0)
        tail = figures.once_exposed_s.get(kind, 0.0)
        parts = (sync, tail, figures.exposed_s.get(kind, 0.0) - sync - tail)
        lost -= sum(min(0.0, part) for part in parts)
        exposed[kind] = sum(max(0.0, part) for part in parts)
        if kind in figures.sync_exposed_s:
            figures.sync_exposed_s[kind] = max(0.0, sync)
        if kind in figures.once_exposed_s:
            figures.once_exposed_s[kind] = max(0.0, tail)
    figures.exposed_s = exposed
    return lost


class RoleCache:
    """Traced ranks by everything that decides their trace, so layouts sharing a rank role
    trace it once. A search's worker processes each fill a cache of their own; what they
    traced comes back (``made``) and is ``adopt``ed by the search's, which the next pass's
    workers start from: a role traced in one pass is not traced again in the next."""

    def __init__(self, known: dict[Any, RankCost] | None = None) -> None:
        self._costs: dict[Any, RankCost] = dict(known or {})
        self.made: dict[Any, RankCost] = {}  # traced here, not known at the start
        self.traces = 0  # the traces made for this cache, here or by the workers it adopted from

    def get(self, key: Any, make: Callable[[], RankCost]) -> RankCost:
        cost = self._costs.get(key)
        if cost is None:
            cost = self._costs[key] = self.made[key] = make()
            self.traces += 1
        return cost

    @property
    def known(self) -> dict[Any, RankCost]:
        """Every traced rank this cache holds."""
        return dict(self._costs)

    def adopt(self, made: dict[Any, RankCost]) -> None:
        """Take in the ranks a worker traced (``made`` of its cache), counting its traces."""
        self._costs.update(made)
        self.traces += len(made)


def shallow_overrides(overrides: dict[str, Any], per_chunk: int, chunks: int, dense: int = 0) -> dict[str, Any]:
    """A shallow trace's model options: ``per_chunk`` blocks in each of ``chunks`` chunks. Leading
    dense blocks (``dense``: DeepSeek's ``n_dense_layers``, ``dense_blocks_of``) sit in the first
    chunk, at most ``per_chunk`` of them: the traced chunks after it stand for the expert chunks
    of the deep model, not for the dense ones a shallow stack would push into them (DeepSeek-V3's
    3 dense blocks over chunks of 1 and 2 blocks would leave the trace no expert block at all).
    Without a pipeline, every dense block stays (a trace of ``per_chunk`` >= 3 blocks holds them)."""
    shallow = {**overrides, "n_layer": per_chunk * chunks}
    if dense > per_chunk:
        shallow["n_dense_layers"] = per_chunk
    return shallow


def _empty_end_chunk(request: ModelRequest, options: TraceOptions, execution: Execution, gpu: GPU,
                     cluster: Cluster, rank: int, prepare: Callable[[Any], Any] | None, dense: int) -> RankCost:
    """The role of an end chunk that holds the embedding or the head and no block (Llama 3
    405B's, ``layout.split_layers``), traced as it is: ``execution``'s pipeline with that chunk
    empty and a block in each other, so the trace holds the chunk's own work (the embedding's
    forward, backward and gradient; the norm, head and loss) and its sends, not a line through
    deeper traces read below them."""
    stage = rank // (execution.world // execution.pipeline)  # the pipeline dimension is outermost
    if stage not in (0, execution.pipeline - 1):
        raise ValueError("only the first and the last pipeline chunk may hold no block")
    end = "first_stage_layers" if stage == 0 else "last_stage_layers"
    shortened = replace(execution, **{end: 0})
    req = replace(request, overrides=shallow_overrides(request.overrides, 1, execution.chunks - 1, dense))
    # the options of the blocks (their attention kernel, fused pointwise ops, FP8 linears)
    # reach nothing in a chunk without one, and each is refused where nothing uses it
    blockless = replace(options, sdpa="fused", pointwise="eager", fp8=False)
    return rank_cost(req, blockless, shortened, gpu, cluster, rank, prepare)


@functools.lru_cache(maxsize=64)
def _dense_blocks(target: str, overrides: tuple[tuple[str, Any], ...]) -> int:
    from nnperf.zoo import get_model

    spec = get_model(target)
    if "n_dense_layers" not in spec.options:
        return 0
    import torch

    with torch.device("meta"):  # one block: the option is read, not the stack built
        return leading_dense_blocks(spec.build(1, None, **{**dict(overrides), "n_layer": 1}).info["config"])


def leading_dense_blocks(config: dict[str, Any]) -> int:
    """A built model's leading dense blocks before its experts (0 without experts), from its
    config."""
    return int(config.get("n_dense_layers", 0)) if config.get("n_experts") else 0


def dense_blocks_of(request: ModelRequest) -> int:
    """The leading dense blocks of a built-in mixture-of-experts stack (DeepSeek's
    ``n_dense_layers``, set or its model's default); 0 for any other model."""
    if not isinstance(request.target, str) or ":" in request.target:
        return 0
    return _dense_blocks(request.target, tuple(sorted(request.overrides.items())))  # scalar options


def scaled_cost(request: ModelRequest, options: TraceOptions, execution: Execution, gpu: GPU,
                cluster: Cluster, rank: int, layers: int | None, cache: RoleCache | None = None,
                prepare: Callable[[Any], Any] | None = None, per_chunk: int | None = None) -> RankCost:
    """``rank_cost`` of a deep stack from two shallow traces (see the module docstring), or of
    the model as it is when it is shallow or not a built-in stack. ``per_chunk``: the blocks
    per pipeline chunk to extrapolate to (default: ``layers`` over the execution's chunks)."""
    cache = cache or RoleCache()
    chunks = execution.chunks
    key = (repr(request), options, execution, gpu.id, cluster.id)

    dense = dense_blocks_of(request)

    def at(k: int | None) -> RankCost:
        req = request if k is None else replace(request, overrides=shallow_overrides(request.overrides, k, chunks,
                                                                                   dense))
        return cache.get((*key, rank, k), lambda: rank_cost(req, options, execution, gpu, cluster, rank, prepare))

    if per_chunk is None and layers:
        depths = set(execution.chunk_layers(layers))  # refused where the chunks cannot split the layers
        if len(depths) > 1:
            raise ValueError("an uneven pipeline is composed per stage role: give per_chunk")
        per_chunk = depths.pop()
    per_chunk = per_chunk or 0
    if layers and per_chunk == 0:
        return cache.get((*key, rank, "no block"),
                         lambda: _empty_end_chunk(request, options, execution, gpu, cluster, rank, prepare, dense))
    if not layers or per_chunk <= SCALE_POINTS[-1]:
        depth = None if not layers or per_chunk * chunks == layers else per_chunk
        return at(depth)
    low, high = (at(k) for k in SCALE_POINTS)
    return extrapolate(low, high, *SCALE_POINTS, per_chunk)
