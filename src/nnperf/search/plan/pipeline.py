"""A pipeline-parallel layout's step from its traced stage roles.

A pipeline rank's work is its chunks' forward and backward of each micro-batch (the actions of
the schedule), whatever the schedule; so the plan traces each distinct stage *role* once, with
the real ``PipelineStage`` on the fake process group running one micro-batch through one chunk
(``ScheduleGPipe``, one micro-batch): the first stage (embeddings + blocks), a middle stage
(blocks) and the last stage (blocks + head + loss), each with the layout's tensor- and
data-parallel engines, deep chunks from two shallow traces (``search.plan.rank``). The roles
serve every schedule and interleaving of the same pipeline degree. Then:

- time: every rank's actions in the schedule's own order (``passes.pipeline_timeline``; torch's
  ``pipeline_order`` for the interleaved schedules), each action the traced role's time, a
  transfer between stages one send of the traced activation on the link between their ranks
  (``kernels.collectives``), which holds the sending stage until it arrives where the engine
  waits for its sends (``Execution.blocking_pipeline_sends``: Megatron-LM's 1F1B); each rank's
  optimizer and gradient synchronization after its last action (its chunks' traced tails); the
  bubble is what the replay leaves idle; with Megatron-Core's expert overlap each backward and
  the forward after it run as one step, saving what the shorter chunk's MoE layers save
  (``search.plan.expert_overlap``), its forward's activations alive beside the backward's;
- memory: the role's traced peak with one micro-batch, plus the model states of the rank's
  other chunks, plus the saved activations of the micro-batches the schedule keeps in flight
  beyond the traced one (the most the rank holds at once over its chunks in the real order,
  ``peak_saved``): affine in the in-flight
  count, which holds when the peak is the start of a backward (tests compare with direct traces
  of the real schedules). The transfers among a stage's saved activations are held as its
  engine holds them (``passes.memory.transfers``): torch keeps the receive buffers of every
  micro-batch of the step (``step_buffers``) and each output sent until its backward;
  Megatron-LM frees each output once sent and receives a gradient only for its backward
  (``in_flight_bytes``). Under FSDP2 a stage's backward neither reshards nor reduces
  (``PipelineStage.backward_maybe_with_nosync``): its whole gradient accumulates until the
  stage's ``REDUCE_GRAD`` after its last micro-batch, and torch's runtime keeps the next three
  stages a rank computes gathered (``_add_unshard_reshard``). Where a rank's chunks take turns at
  their backwards (two rounds of micro-batches or more), its other chunks' gathered blocks and
  accumulated gradients are alive while a chunk runs its backward; the most of them at any
  backward of the real order is added too (``unsharded_extra``).

Zero-bubble schedules split the backward into input and weight gradients, which one traced
micro-batch of GPipe does not time apart: they run their real schedule over ``p`` micro-batches
(``traced_schedule_step``), the in-flight peak of multiples of ``p``.

A search (``prune``) traces the first stage's role before the others and stops where that role
alone cannot fit. Rank 0 holds stage 0: its memory is the first role's traced peak plus the saved
activations of the first stage's other in-flight micro-batches, plus (interleaved schedules) the
model states and in-flight saved activations of its later chunks. Those later terms are byte
counts (a chunk's parameters and saved tensors, extrapolated in depth from 3 and 4 blocks, where
each grows with the blocks), so rank 0's memory without them is a lower bound of it, and the
layout's memory is the largest rank's. With one chunk per rank (GPipe, 1F1B) the bound is rank
0's memory itself. A search that has a best step so far also stops where the first role bounds
the step above it (``replay_lower_bound``: the schedule replayed with the other stages at their
blocks' time, so the bound holds the bubble). Each further role traced while one is left, it stops
where some rank's memory without the terms of the roles left cannot fit, by the same argument (an
interleaved rank 0's later chunks are middle roles: the HSDP pipelines of a 175B GPT's search were
out of memory by their first and middle roles, the last left untraced).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from nnperf.errors import UsageError
from nnperf.hardware import GPU
from nnperf.hardware.cluster import Cluster
from nnperf.kernels.collectives import estimate_collective
from nnperf.layout import Execution
from nnperf.passes.memory.capacity import capacity, fits
from nnperf.passes.pipeline_timeline import (
    Action,
    PipelineTime,
    extended,
    in_flight,
    joint_pairs,
    orders,
    simulate,
)
from nnperf.request import ModelRequest
from nnperf.search.plan.context import check_sequence, traced_as, with_ring_attention
from nnperf.search.plan.expert_overlap import hidden_all_to_alls
from nnperf.search.plan.rank import RoleCache, scaled_cost
from nnperf.search.plan.results import (
    PipelineFigures,
    Planned,
    RankCost,
    RankFigures,
    StateBytes,
    TimeSplit,
    collective_totals,
    per_step,
)
from nnperf.trace.options import AMP_DTYPES, DTYPES, TraceOptions
from nnperf.trace.parallel.pipeline import schedule_order
from nnperf.vocab import Phase


def pipeline_step(request: ModelRequest, options: TraceOptions, execution: Execution, gpu: GPU,
                  cluster: Cluster, layers: int | None, cache: RoleCache, prepare: Any, prune: bool = False,
                  slower_than: float | None = None) -> Planned:
    """The layout's step and memory from its stage roles; ``prune``: a layout whose first stage
    alone does not fit the GPU is returned unfit with that lower bound, its other roles untraced;
    ``slower_than``: so is one whose ``replay_lower_bound`` from its first stage's role alone
    takes that long."""
    if execution.pipeline_schedule == "zero-bubble":
        return traced_schedule_step(request, options, execution, gpu, cluster, layers, cache, prepare)
    p, micro = execution.pipeline, execution.grad_accum
    virtual = execution.chunks_per_rank
    stages = p * virtual
    stride = execution.world // p
    # roles: a GPipe pipeline of one micro-batch of three stages, whatever the degree: a stage's
    # trace is its own chunk, its neighbours' ranks and its data-parallel group, so the first,
    # a middle and the last role of any number of stages are those of three (tested), and the
    # traced model holds three chunks, not p (a 16-stage trace built and wrapped 16 of them);
    # the one- and two-chunk pipelines of two ranks share their roles too
    traced_p = 3
    traced = replace(execution, world=traced_p * stride, pipeline=traced_p, pipeline_schedule="gpipe",
                     virtual_stages=1, grad_accum=1, first_stage_layers=None, last_stage_layers=None,
                     expert_overlap=False)
    role_request = replace(request, batch=execution.micro_batch)
    if execution.context > 1:  # each stage's role traced on its sequence chunk, ring attention added
        if not request.seq_len:
            raise UsageError("context parallelism needs a sequence length (--seq)")
        check_sequence(request.seq_len, execution.context)
        traced = traced_as(traced)
        role_request = replace(role_request, seq_len=request.seq_len // execution.context)
    # each chunk's role at the chunk's own depth (an uneven pipeline's end stages are shorter):
    # a role's trace is its own chunk, whatever the depth of the others; a rank's other chunks
    # are middle roles, at their own depth where an end stage's chunks differ from the middle's
    depths = execution.chunk_layers(layers) if layers else None
    role_ranks = {"first": 0, "last": traced_p - 1, "middle": 1}

    def role_of(stage: int) -> tuple[str, int | None]:
        name = "first" if stage == 0 else "last" if stage == stages - 1 else "middle"
        return name, depths[stage] if depths else None

    def traced_role(role: tuple[str, int | None]) -> RankCost:
        name, depth = role
        cost = scaled_cost(role_request, options, traced, gpu, cluster, role_ranks[name] * stride, layers, cache,
                           prepare, per_chunk=depth)
        return with_ring_attention(cost, execution, cluster) if execution.context > 1 else cost

    order = replay_orders(execution)
    held = {r: sorted({a.stage for a in acts}) for r, acts in order.items()}
    # what each rank holds at once: with the expert overlap, a backward's activations beside
    # the forward it runs with (``joint_pairs``)
    alive = {r: joint_pairs(acts) for r, acts in order.items()} if execution.expert_overlap else order
    flight = {s: n for acts in alive.values() for s, n in in_flight([a.label for a in acts]).items()}

    gathered, accumulated = unsharded_per_stored(execution, options)

    def memory(rank: int, roles: dict[tuple[str, int | None], RankCost]) -> float:
        """Rank ``rank``'s memory; the terms of roles not in ``roles`` left out."""
        own = roles.get(role_of(held[rank][0]))
        later = [roles[role_of(s)].figures for s in held[rank][1:] if role_of(s) in roles]
        others = sum(f.model_states for f in later)

        def saved(stage: int) -> float:
            return in_flight_bytes(execution, roles[role_of(stage)].figures) if role_of(stage) in roles else 0.0

        def buffers(stage: int) -> float:
            return step_buffers(execution, roles[role_of(stage)].figures, micro) if role_of(stage) in roles else 0.0

        # the traced role holds one micro-batch of its own stage already, its transfers as
        # torch holds them; beyond the micro-batches in flight, the receive buffers its engine
        # holds all step, and (Megatron-LM) the gradient received for the backward running
        held_buffers = sum(buffers(s) for s in held[rank])
        extra = peak_saved(alive[rank], saved) + held_buffers - (
            own.figures.saved_activations - backward_buffer(execution, own.figures) if own else 0.0)

        def stored(stage: int) -> float:
            return roles[role_of(stage)].figures.states.parameters if role_of(stage) in roles else 0.0

        unsharded = unsharded_extra(order[rank], held[rank][0], lambda s: gathered * stored(s),
                                    lambda s: accumulated * stored(s)) if gathered else 0.0
        if own is None:
            return others + extra + unsharded
        # torch's receive buffers outlive the backward (the traced role's own at most one pair)
        kept = max(0.0, held_buffers - own.figures.transfers.received)
        return phase_peak(own.figures, extra + unsharded, later_optimizers(execution, own.figures, later) + kept) + others

    roles = {role_of(0): traced_role(role_of(0))}
    if prune and (bound := int(memory(0, roles))) > capacity(gpu):  # a lower bound (module docstring)
        return Planned(execution, memory_bytes=bound, memory_bound="its first pipeline stage alone")
    if prune and slower_than is not None:
        first = roles[role_of(0)]
        transfer_first = _transfer(first.figures.p2p_bytes, p, stride, cluster)
        at_least = replay_lower_bound(first, order, stages, depths or (0,) * stages, transfer_first,
                                      execution.blocking_pipeline_sends, execution.expert_overlap)
        if at_least >= slower_than:
            return Planned(execution, step_s=at_least, fits=True, memory_bytes=int(memory(0, roles)),
                           memory_bound="its first pipeline stage alone", time_bound=REPLAY_BOUND)
    wanted = list(dict.fromkeys(role_of(stage) for stage in range(stages)))
    for role in wanted:
        if role in roles:
            continue
        roles[role] = traced_role(role)
        if not prune or len(roles) == len(wanted):
            continue
        bound = int(max(memory(r, roles) for r in range(p)))  # without the untraced roles' terms: a lower bound
        if bound > capacity(gpu):
            names = " and ".join(dict.fromkeys(name for name, _ in roles))
            return Planned(execution, memory_bytes=bound, memory_bound=f"its {names} pipeline stages alone")

    def action_s(stage: int, kind: str) -> float:
        role = role_of(stage)
        return roles[role].figures.action(kind, role_ranks[role[0]])

    activation = max(c.figures.p2p_bytes for c in roles.values())

    def per_rank(rank: int, figure: Callable[[RankFigures], float]) -> float:
        return sum(figure(roles[role_of(s)].figures) for s in held[rank])

    def joint(_rank: int, backward: Action, forward: Action) -> float:
        """A backward and the next forward as Megatron-Core's expert overlap runs them: their
        MoE layers paired one to one, so the shorter chunk's saving (``expert_overlap``)."""
        return min(roles[role_of(backward.stage)].figures.expert_overlap_s,
                   roles[role_of(forward.stage)].figures.expert_overlap_s)

    sim = replay_schedule(execution, order, lambda actions: simulate(
        actions, stages, lambda r, a: action_s(a.stage, a.kind), _transfer(activation, p, stride, cluster),
        lambda r: per_rank(r, lambda f: f.head_s), lambda r: per_rank(r, lambda f: f.tail_s),
        execution.blocking_pipeline_sends, joint if execution.expert_overlap else None))
    flops = sum(per_rank(r, lambda f: f.flops) for r in range(p)) * micro * stride
    return _planned(execution, gpu, sim, roles[role_of(held[sim.critical_rank][0])], flops,
                    max(memory(r, roles) for r in range(p)), micro, order, flight, activation,
                    {r: per_rank(r, lambda f: f.states.parameters) for r in range(p)},
                    chunks=[roles[role_of(s)].figures for s in held[sim.critical_rank]])


def phase_peak(figures: RankFigures, step_extra: float, optimizer_extra: float) -> float:
    """A pipeline rank's peak from its first chunk's traced role: the highest of forward and
    backward with ``step_extra`` more (the rank's other in-flight micro-batches and gathered
    blocks, alive only then), or the optimizer step with ``optimizer_extra`` more (what its
    other chunks' optimizers add, ``later_optimizers``: after the last backward, when no
    activation is saved any more), plus what the device holds beyond the allocated peak."""
    by_phase = figures.memory_by_phase
    if not by_phase:
        return figures.memory + step_extra
    step = max((peak for phase, peak in by_phase.items() if phase != Phase.OPTIMIZER), default=0.0)
    optimizer = by_phase[Phase.OPTIMIZER] + optimizer_extra if Phase.OPTIMIZER in by_phase else 0.0
    return max(step + step_extra, optimizer) + figures.mem_outside


def in_flight_bytes(execution: Execution, figures: RankFigures) -> float:
    """What a stage holds for each of its micro-batches in flight: its traced micro-batch's
    saved activations less the transfers its engine holds otherwise (``passes.memory.transfers``):
    Megatron-LM frees the output it sent and receives the output's gradient only for its
    backward; torch keeps the output and holds both receive buffers for every micro-batch of the
    step (``step_buffers``)."""
    transfers = figures.transfers
    if execution.megatron_layout:
        return figures.saved_activations - transfers.received_gradients - transfers.sent_activations
    return figures.saved_activations - transfers.received


def step_buffers(execution: Execution, figures: RankFigures, micro_batches: int) -> float:
    """The receive buffers a stage holds for the whole step: torch's one pair per micro-batch of
    the step, allocated when its schedule first runs; none under Megatron-LM, which allocates each
    when it receives."""
    return 0.0 if execution.megatron_layout else micro_batches * figures.transfers.received


def backward_buffer(execution: Execution, figures: RankFigures) -> float:
    """The receive buffer alive in a stage's backward besides its micro-batches in flight:
    Megatron-LM's gradient received for it."""
    return figures.transfers.received_gradients if execution.megatron_layout else 0.0


def later_optimizers(execution: Execution, own: RankFigures, later: list[RankFigures]) -> float:
    """What a rank's later chunks add to its optimizer step's peak: Megatron-LM steps one
    optimizer over all of a rank's chunks (``get_megatron_optimizer(model_chunks)``), so their
    temporaries add up; torchtitan one optimizer per chunk, one after another
    (``OptimizersContainer.step``), so only the largest is alive at once."""
    temporaries = [f.optimizer_rise for f in later]
    if execution.megatron_layout:
        return sum(temporaries)
    return max(0.0, max(temporaries, default=0.0) - own.optimizer_rise)


def gathered_per_stored(options: TraceOptions) -> float:
    """Bytes of a parameter FSDP2 gathers per byte of its stored shard: the autocast dtype's
    over the model's (``trace.parallel.data.mixed_precision``: bf16 gathers of fp32 shards under
    --amp bf16, 0.5)."""
    stored = DTYPES[options.dtype or "fp32"].itemsize
    return (AMP_DTYPES[options.amp].itemsize if options.amp else stored) / stored


def accumulated_per_stored(options: TraceOptions) -> float:
    """Bytes of the unsharded gradient FSDP2 accumulates across micro-batches without a
    reduction, per byte of the parameter's stored shard: in the reduce dtype where it differs
    from the gathered one (``FSDPParam.to_accumulated_grad_if_needed``: fp32 under --amp, as
    ``MixedPrecisionPolicy(reduce_dtype=float32)``), else the parameter's own dtype."""
    stored = DTYPES[options.dtype or "fp32"].itemsize
    return (4 if options.amp else stored) / stored


def unsharded_per_stored(execution: Execution, options: TraceOptions) -> tuple[float, float]:
    """Bytes of a chunk's gathered parameters and of its accumulated gradient per byte of its
    stored shard of parameters: each as whole as its shard group's (FSDP2 gathers the padded
    shards); none where the parameters are not sharded (DDP's and ZeRO-1's gradients are model
    states) or where experts are (their shard group is smaller than the others'; not counted)."""
    if execution.replicates_parameters or execution.expert > 1:
        return 0.0, 0.0
    return execution.shard * gathered_per_stored(options), execution.shard * accumulated_per_stored(options)


#: The stages of a rank torch's pipeline runtime keeps gathered under FSDP: the one computing and
#: the next it prefetches (``_add_unshard_reshard``'s ``max_active_stages``).
ACTIVE_STAGES = 3


def unsharded_extra(actions: list[Action], traced: int, gathered: Callable[[int], float],
                    accumulated: Callable[[int], float]) -> float:
    """The most bytes a rank's other chunks hold unsharded at any of its backwards, in the
    order ``actions`` (module docstring): at a backward of stage ``s``, the gathered blocks
    (``gathered(stage)``) of the other stages among the next ``ACTIVE_STAGES`` it computes, and
    the accumulated gradient (``accumulated(stage)``) of every other stage between its first
    and last backward; ``traced``, whose trace holds its own, and ``s`` left out."""
    backwards = [i for i, a in enumerate(actions) if a.kind in ("B", "I")]
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i in backwards:
        first.setdefault(actions[i].stage, i)
        last[actions[i].stage] = i
    most = 0.0
    for i in backwards:
        own = {actions[i].stage, traced}
        active: list[int] = []
        for later in actions[i:]:
            if later.stage not in active:
                active.append(later.stage)
                if len(active) == ACTIVE_STAGES:
                    break
        held = sum(accumulated(s) for s in first if s not in own and first[s] < i < last[s])
        most = max(most, held + sum(gathered(s) for s in active if s not in own))
    return most


#: The most micro-batches a schedule is replayed with. Beyond, it is replayed at two counts of
#: whole rounds below (``replayed_counts``) and the replay's figures are read off the line
#: through them: once the pipeline is full, each round of ``p`` more micro-batches adds the same
#: actions to every rank, each starting as its rank's previous one ends, so every time grows
#: by the same amount a round (exact for 1F1B at any count and for the interleaved schedules at
#: whole rounds: tested against the full replay). Why: the replay takes a Python step per
#: action, and a per-GPU batch given as the global one (262,144 micro-batches a pipeline of 16
#: stages x 8 chunks) ran 11 minutes into 22 GB before printing anything.
REPLAYED_MICRO_BATCHES = 1024


def replayed_counts(execution: Execution) -> tuple[int, int] | None:
    """The two whole-round micro-batch counts the schedule is replayed at where it runs more
    than ``REPLAYED_MICRO_BATCHES`` (and more than both); None where it is replayed as it is."""
    p = execution.pipeline
    low = max(REPLAYED_MICRO_BATCHES // p, 4) * p
    return (low, low + p) if execution.grad_accum > low + p else None


def replay_orders(execution: Execution) -> dict[int, list[Action]]:
    """The rank orders the memory, the bounds and the replay read: the schedule's, or its orders
    at the lower replayed count where the replay is extended (``replayed_counts``): there a
    rank's micro-batches in flight are already the most it keeps (reached in its warm-up)."""
    counts = replayed_counts(execution)
    return rank_orders(execution if counts is None else replace(execution, grad_accum=counts[0]))


def replay_schedule(execution: Execution, order: dict[int, list[Action]],
                    replay: Callable[[dict[int, list[Action]]], PipelineTime]) -> PipelineTime:
    """The layout's schedule replayed by ``replay`` over ``order`` (``replay_orders``): as it is,
    or beyond ``REPLAYED_MICRO_BATCHES`` the line through that replay and one of a round more."""
    counts = replayed_counts(execution)
    sim = replay(order)
    if counts is None:
        return sim
    return extended(sim, replay(rank_orders(replace(execution, grad_accum=counts[1]))), *counts,
                    execution.grad_accum)


def rank_orders(execution: Execution) -> dict[int, list[Action]]:
    """Each pipeline rank's actions in the layout's schedule (torch's ``pipeline_order`` for
    the interleaved schedules)."""
    p, micro, virtual = execution.pipeline, execution.grad_accum, execution.chunks_per_rank
    ir = schedule_order(execution.pipeline_schedule or "", p, virtual, micro) if virtual > 1 else None
    return orders(execution.pipeline_schedule or "", p, micro, ir)


def peak_saved(actions: list[Action], saved: Callable[[int], float]) -> float:
    """The most saved activations a rank holds at once: at each of its forwards, the
    micro-batches of every chunk whose forward ran and whose backward (``B``, or ``I`` of a
    split backward) has not, each its stage's ``saved`` bytes. Not the sum of each chunk's own
    most in flight: an interleaved schedule's chunks reach theirs at different times (rank 0 of
    8 stages x 5 chunks and 64 micro-batches holds 47 chunk micro-batches at once, where the
    chunks' own peaks add up to 63)."""
    live = peak = 0.0
    for action in actions:
        if action.kind == "F":
            live += saved(action.stage)
            peak = max(peak, live)
        elif action.kind in ("B", "I"):
            live -= saved(action.stage)
    return peak


def blocks_in_flight(execution: Execution, layers: int) -> int:
    """The most blocks whose saved activations rank 0 holds at once under the layout's schedule:
    its forwards not yet matched by a backward (``B``, or ``I`` of a split backward), each
    counting its chunk's blocks (``Execution.chunk_layers``)."""
    depths = execution.chunk_layers(layers)
    return int(peak_saved(replay_orders(execution)[0], lambda stage: depths[stage]))


def _transfer(activation: float, p: int, stride: int, cluster: Cluster) -> Callable[[int, int], float]:
    """A micro-batch's activation (or its gradient) sent from stage ``src`` to ``dst``: one
    send on the link between their ranks. Cached per pair: the replay asks at every action
    twice (its input's arrival, its own send) over a handful of stage pairs."""
    @functools.cache
    def transfer(src: int, dst: int) -> float:
        pair = ((src % p) * stride, (dst % p) * stride)
        return estimate_collective("send_recv", int(activation), pair, cluster).time_s
    return transfer


#: What ``replay_lower_bound`` counts.
REPLAY_BOUND = ("the schedule replayed with its first stage as traced and every other stage at its blocks' time "
                "alone")


def replay_lower_bound(first: RankCost, order: dict[int, list[Action]], stages: int, depths: tuple[int, ...],
                       transfer: Callable[[int, int], float], blocking_sends: bool = False,
                       expert_overlap: bool = False) -> float:
    """A lower bound of a pipeline's step from its first stage's role alone: the schedule's
    replay (``passes.pipeline_timeline.simulate``) with the first stage's actions, head and
    tail as traced and every other stage's action at its blocks' share of the first stage's
    (``depths[stage]`` blocks at what one more block adds to the traced first stage, ``RankCost.
    per_block``), which leaves out only what a stage does besides its blocks (the head and the
    loss of the last stage, receiving its input), and the other ranks' heads and tails (their
    optimizer steps) left out. A replay's end only grows with any action's duration (each
    action starts at the latest of its rank's previous action and its inputs), so this is at
    most the step the full replay gives; it holds rank 0's own work and the pipeline's fill and
    drain, the bubble. A first stage traced as it is (no extrapolation) has no per-block time:
    the other stages count zero, and the bound is rank 0's own work. ``blocking_sends``: as the
    full replay's (a send that holds its rank only lengthens it); ``expert_overlap``: each
    backward run beside the next forward as the full replay runs it, saving its stage's blocks'
    share (``depths``) of what the first stage's would (every chunk's saving is its blocks')."""
    def duration(_rank: int, action: Action) -> float:
        if action.stage == 0:
            return first.figures.action(action.kind, 0)
        per_block = first.per_block.action(action.kind, 0) if first.per_block else 0.0
        return depths[action.stage] * max(0.0, per_block)

    def saving(stage: int) -> float:
        if stage == 0 or not first.per_block:
            return first.figures.expert_overlap_s
        return depths[stage] * max(0.0, first.per_block.expert_overlap_s)

    def joint(_rank: int, backward: Action, forward: Action) -> float:
        return max(saving(backward.stage), saving(forward.stage))

    def head(rank: int) -> float:
        return first.figures.head_s if rank == 0 else 0.0

    def tail(rank: int) -> float:
        return first.figures.tail_s if rank == 0 else 0.0

    return simulate(order, stages, duration, transfer, head, tail, blocking_sends,
                    joint if expert_overlap else None).step_s


def _planned(execution: Execution, gpu: GPU, sim: PipelineTime, critical: RankCost, flops: float,
             memory: float, micro: int, order: dict[int, list[Action]], flight: dict[int, int],
             activation: float, parameters: dict[int, float], traced_micro: int = 1,
             chunks: list[RankFigures] | None = None) -> Planned:
    """``chunks``: the figures of each chunk the critical rank holds (one micro-batch each), whose
    sums over the step make its time split; by default the critical role's alone."""
    scale = micro / traced_micro
    peak = critical.mfu_peak
    f = critical.figures
    chunks = chunks or [f]
    exposed: dict[str, float] = {}
    for chunk in chunks:
        for kind, seconds in chunk.exposed_over(scale).items():
            exposed[kind] = exposed.get(kind, 0.0) + seconds
    blocked = sim.blocked_s.get(sim.critical_rank, 0.0)  # the schedule's own sends, waited for
    if blocked:
        exposed["send_recv"] = exposed.get("send_recv", 0.0) + blocked
    sent = sim.sent_s.get(sim.critical_rank, 0.0)  # the schedule's own sends, overlapped or waited for
    # an action's time holds the compute stream's waits for its collectives; the split reports
    # them as exposed communication, so compute is the actions' time without them (the
    # once-per-step synchronization's waits are the step's head and tail, not actions')
    waited = sum(max(0.0, seconds - c.sync_exposed_s.get(kind, 0.0)) * scale
                 for c in chunks for kind, seconds in c.exposed_s.items())
    # what the expert overlap's joint steps saved is the all-to-alls' waits they hid
    hidden = min(sim.joint_s.get(sim.critical_rank, 0.0), exposed.get("all_to_all", 0.0))
    exposed = hidden_all_to_alls(exposed, hidden)
    waited -= hidden
    tokens = critical.per_micro / traced_micro * micro * execution.data_parallel
    planned = Planned(
        execution, step_s=sim.step_s,
        throughput=tokens / sim.step_s if sim.step_s else 0.0, throughput_unit=critical.unit,
        mfu=flops / sim.step_s / (peak * execution.world) if sim.step_s and peak else 0.0,
        memory_bytes=int(memory), context_bytes=int(f.mem_context),
        split=TimeSplit(compute_s=max(0.0, sim.busy_s[sim.critical_rank] - waited),
                        recomputation_s=sum(c.recompute_s for c in chunks) * scale,
                        pipeline_bubble_s=sim.bubble_s[sim.critical_rank],
                        after_schedule_s=sim.step_s - max(sim.end_s.values()),  # after the flush
                        communication_s=sum(c.comm_over(scale) for c in chunks) + sent,
                        overlap_slowdown_s=sum(c.slowdown_over(scale) for c in chunks),
                        exposed_communication_s=exposed,
                        # the optimizer's issue once per step, as its kernels are (the chunk's tail)
                        host_s=sum(per_step(scale, c.host_busy_s, c.optimizer_host_s) for c in chunks)),
        # the critical rank's state and collectives: every chunk it holds
        state_bytes=sum((c.states for c in chunks), StateBytes()),
        collectives=collective_totals(*chunks),
        # the critical stage's first rank (the pipeline is the mesh's outermost dimension)
        rank=sim.critical_rank * (execution.world // execution.pipeline),
        pipeline=PipelineFigures(len(flight), micro, sim.bubble_fraction, sim.critical_rank, flight,
                                 int(activation), parameters),
    )
    planned.fits = fits(planned.memory_bytes, capacity(gpu))
    return planned


def traced_schedule_step(request: ModelRequest, options: TraceOptions, execution: Execution, gpu: GPU,
                         cluster: Cluster, layers: int | None, cache: RoleCache, prepare: Any) -> Planned:
    """The first, a middle and the last rank traced running the real schedule over ``p``
    micro-batches (every action of each, their in-flight activations included), the schedule
    replayed with all micro-batches."""
    if execution.context > 1:
        raise UsageError("context parallelism with a zero-bubble schedule is not modelled; use 1f1b or "
                         "interleaved-1f1b")
    if execution.uneven:
        raise UsageError("zero-bubble schedules of uneven stages are not modelled (their real schedule is "
                         "traced with every chunk at one depth); use 1f1b or interleaved-1f1b")
    p, micro = execution.pipeline, execution.grad_accum
    virtual = execution.chunks_per_rank
    stages = p * virtual
    traced_micro = min(micro, p)
    traced_execution = replace(execution, grad_accum=traced_micro)
    stride = execution.world // p
    ranks = sorted({0, p - 1} | ({1} if p > 2 else set()))
    costs = {r: scaled_cost(replace(request, batch=execution.micro_batch * traced_micro), options,
                            traced_execution, gpu, cluster, r * stride, layers, cache, prepare) for r in ranks}

    def role(rank: int) -> RankCost:
        return costs.get(rank) or costs[1]

    times: dict[tuple[str, int], float] = {}
    for cost in costs.values():
        for key, seconds in cost.figures.action_s.items():
            kind, stage = key.split("@")
            times[(kind, int(stage))] = seconds
    middle: dict[str, list[float]] = {}
    for (kind, stage), seconds in times.items():
        if 0 < stage < stages - 1:
            middle.setdefault(kind, []).append(seconds)

    def duration(rank: int, action: Action) -> float:
        found = times.get((action.kind, action.stage))
        return found if found is not None else sum(middle[action.kind]) / len(middle[action.kind])

    activation = max(c.figures.p2p_bytes for c in costs.values())
    order = replay_orders(execution)
    sim = replay_schedule(execution, order, lambda actions: simulate(
        actions, stages, duration, _transfer(activation, p, stride, cluster), lambda r: role(r).figures.head_s,
        lambda r: role(r).figures.tail_s))
    flight = {s: n for acts in order.values() for s, n in in_flight([a.label for a in acts]).items()}
    flops = sum(role(r).figures.flops for r in range(p)) * micro / traced_micro * stride

    def memory(cost: RankCost) -> float:
        # the trace holds the receive buffers of its micro-batches, the step those of all of them
        return cost.figures.memory + step_buffers(execution, cost.figures, micro - traced_micro) / traced_micro

    return _planned(execution, gpu, sim, role(sim.critical_rank), flops,
                    max(memory(c) for c in costs.values()), micro, order, flight, activation,
                    {r: role(r).figures.states.parameters for r in range(p)}, traced_micro)
