"""``nnperf plan``: layouts of a model on N GPUs, each traced one rank role at a time.

A candidate ``Execution`` combines data parallelism (DDP; ZeRO-1, DDP with the optimizer state
sharded; FSDP2 full shard; HSDP sharded inside a node and replicated across), tensor parallelism (with sequence parallelism by
default, torchtitan's composition; without it for the winner's degree, for comparison),
pipeline parallelism (1F1B and interleaved 1F1B by default; GPipe and zero-bubble on request),
activation checkpointing (none, then selective, then full, only while a layout does not fit)
and gradient accumulation / micro-batches to reach the global batch. Each rank role of the
layout (the one rank of a data/tensor-parallel layout; the first, a middle and the last stage
of a pipeline) is traced with the real engines on a fake process group (``search.plan.rank``,
deep stacks from two shallow traces), timed on the GPU with its collectives on the cluster
beside the compute, and its memory predicted by the memory pass. A pipeline's step is the
replay of its schedule (``passes.pipeline_timeline``) from the traced per-action times, with
the bubble explicit. Layouts that fit are ranked by step time; the others are listed with
the reason.

Gradient accumulation without a pipeline: every micro-batch is timed as the traced one; the
optimizer runs once, and so does DDP's (ZeRO-1's) gradient reduction, which only the last
micro-batch runs (``no_sync`` before it): its waits, its bucket copies and the stretch of the
kernels it runs beside count once. FSDP2 reduce-scatters every micro-batch, as torchtitan runs
it. A pipeline's micro-batches
are traced ``p`` at a time (the schedules' in-flight peak for micro-batch counts that are
multiples of ``p``; GPipe: all of them) and the schedule replayed with all of them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from nnperf import progress
from nnperf.errors import UsageError
from nnperf.hardware import GPU
from nnperf.hardware.cluster import Cluster
from nnperf.layout import (
    CHECKPOINT_LEVELS,
    CHECKPOINT_NAMES,
    DATA_PARALLEL,
    DEFAULT_SCHEDULES,
    OPTIMIZER_STATES,
    SEARCHED_CHECKPOINTS,
    TOKEN_DISPATCHERS,
    Execution,
)
from nnperf.passes.memory.capacity import capacity
from nnperf.request import ModelRequest
from nnperf.search.plan.axes import (
    axes_note,
    check_degrees,
    check_virtual_stages,
    chunked_loss_axes,
    default_batch,
    expert_degrees,
    gpus_take_tensor,
    listed,
    model_info,
    request_name,
    search_axes,
    unheld_interleaving,
)
from nnperf.search.plan.bounds import same_work, work_bound
from nnperf.search.plan.evaluate import ASYNC_TP_NEEDS_COMPILE, evaluate
from nnperf.search.plan.framework import framework_kinds, runs_layout
from nnperf.search.plan.layouts import (
    PipelineSplitChoice,
    check_expert_degrees,
    check_micro_batches,
    layouts,
    shape_key,
    why_no_layout,
)
from nnperf.search.plan.notes import notes, routing_note, why
from nnperf.search.plan.rank import RoleCache, layers_of
from nnperf.search.plan.results import Plan, Planned
from nnperf.search.plan.states import WHAT as STATES_BOUND
from nnperf.search.plan.states import states_bound
from nnperf.trace.distributed import import_engines
from nnperf.trace.options import AMP_DTYPES, TraceOptions

#: The checkpointing levels the search may try, in order (``nnperf.layout``), and the indices
#: of those it tries unless told (none, the engine's selective policy, full).
CHECKPOINTS = CHECKPOINT_LEVELS
SEARCHED_LEVELS = tuple(CHECKPOINTS.index(level) for level in SEARCHED_CHECKPOINTS)
#: The data-parallel engines a user may restrict the search to (``nnperf plan --data``).
DATA_KINDS = DATA_PARALLEL


def plan(request: ModelRequest, options: TraceOptions, gpu: GPU, gpus: int, cluster: Cluster,
         nodes_of: int | None = None, global_batch: int | None = None, *,
         tensor: Iterable[int] | None = (1,), pipeline: Iterable[int] | None = (1,),
         schedules: Iterable[str] = DEFAULT_SCHEDULES, context: Iterable[int] = (1,),
         expert: Iterable[int] | None = (1,), data: Iterable[str] | None = None,
         checkpoints: Iterable[str | None] | None = None, reshard: Iterable[bool] = (True,),
         split: PipelineSplitChoice | None = None, tp_comm_overlap: bool = False, loss_fusion: bool = False,
         micro_batch: Iterable[int] | None = None, sequence_parallel: bool | None = None,
         expert_tensor: int | None = None, token_dispatcher: str = "alltoall",
         optimizer_states: str = "fp32", grad_reduce_in_fp32: bool = False,
         expert_overlap: bool = False, framework: str | None = None, async_tp: bool = False) -> Plan:
    """Rank the layouts of ``request`` on ``gpus`` GPUs of ``gpu``. ``tensor``/``pipeline``/
    ``expert``: the degrees to try (None: every degree the model and nodes allow; the default,
    1, keeps the data-parallel search; ``context``: context-parallel degrees, modelled in
    closed form). ``data``: the data-parallel engines to try (``DATA_KINDS``; a layout without
    data parallelism has none and stays); ``checkpoints``: the checkpointing levels the search
    may use (``CHECKPOINTS``: ``ENGINE_SELECTIVE`` is each layout's engine's own selective
    policy); None: ``SEARCHED_CHECKPOINTS``, none, the engine's selective policy, full.
    ``reshard``: FSDP2's reshard after forward,
    True (torchtitan's default without pipelines), False (the gathered parameters kept until
    backward: no backward all-gather, ZeRO-2's traffic), or both. ``split``: the chunks per rank
    of the interleaved schedules and an uneven first and last stage (default: 2, even).
    ``tp_comm_overlap``: Megatron-LM's layouts (DDP or ZeRO-1 with sequence parallelism) run
    --tp-comm-overlap (``Execution.tp_comm_overlap``); ``loss_fusion``: Megatron-LM's data
    parallelism (DDP or ZeRO-1) runs --cross-entropy-loss-fusion (``Execution.loss_fusion``).
    ``expert_tensor``: 1, every layout with expert and tensor parallelism runs its experts whole,
    the expert group folded over the tensor-parallel ranks (``Execution.expert_tensor``; those
    whose degrees cannot fold are left out); None: Megatron-Core's default. ``token_dispatcher``:
    how the expert-parallel layouts send tokens to their experts (``Execution.token_dispatcher``;
    "deepep", Megatron-LM's flex dispatcher, beside ddp or zero1 only: FSDP's and HSDP's
    expert-parallel layouts are left out). ``optimizer_states``: what the ZeRO-1 layouts'
    distributed optimizer keeps (``Execution.optimizer_states``; the other engines run PyTorch's
    optimizer on their parameters as they are). ``grad_reduce_in_fp32``: the ZeRO-1 layouts keep
    fp32 main gradients and reduce-scatter them in fp32 (``Execution.grad_reduce_in_fp32``).
    ``expert_overlap``: the expert-parallel layouts Megatron-Core can overlap (DDP or ZeRO-1, no
    pipeline or an interleaved one) run each backward beside the next micro-batch's forward
    (``Execution.expert_overlap``). ``async_tp``: the layouts torch runs with tensor and
    sequence parallelism run torch's async tensor parallelism (``Execution.async_tp``; it needs
    the compiled blocks, ``--pointwise fused``).
    ``micro_batch``: the micro-batch sizes
    a layout may run (None: every split of a data-parallel rank's share of the global batch).
    ``sequence_parallel``: tensor-parallel layouts with sequence parallelism only (True), without
    it only (False: Megatron-LM before 2022), or both (None). ``framework``: every layout planned
    as Megatron-LM or torch runs it, those it does not run left out (``search.plan.framework``);
    None: each as the layout implies (``Execution.megatron_layout``).

    The search runs in passes so that a large cluster is planned in seconds: data and tensor
    parallelism over every degree; then pipeline parallelism at the tensor-parallel degree of
    the best layout of the first pass (the largest degree if none fit), FSDP at every pipeline
    degree, schedule and split, the other data-parallel engines at the one FSDP does best with;
    then that winner's degree without sequence parallelism."""
    nodes_of = nodes_of or cluster.gpus_per_node
    if nodes_of != cluster.gpus_per_node:  # its links as they are, its nodes of nodes_of GPUs: where groups cross
        cluster = replace(cluster, gpus_per_node=nodes_of)
    global_batch = global_batch or gpus * (request.batch or default_batch(request))
    context = list(context)
    layers = layers_of(request)
    asked = (tensor, pipeline)
    # the pipeline and context degrees the GPUs allow are checked before the layers' split, whose
    # valid degrees may not divide the GPUs; a tensor degree the GPUs refuse after the model's
    # rules, which name the degrees the heads allow
    gpus_first = all(gpus_take_tensor(gpus, nodes_of, t) for t in tensor or ())
    if gpus_first:
        check_degrees(gpus, nodes_of, *asked, context, layers=layers)
    info = model_info(request, layers)  # one meta build of one block, for the axes and the note
    tensor, pipeline = chunked_loss_axes(options, tensor, pipeline)
    split = split or PipelineSplitChoice()
    tensor, pipeline = search_axes(request, gpus, nodes_of, layers, tensor, pipeline, info, split,
                                   schedules, context)  # the model's rules first
    left_out = axes_note(request, gpus, asked, tensor, pipeline, info)
    if not gpus_first:
        check_degrees(gpus, nodes_of, *asked, context, layers=layers)
    asked_chunks = split.virtual_asked or split.virtual != PipelineSplitChoice().virtual
    if asked_chunks and asked[1] is not None:  # chunks asked for at the asked degrees: each must split their stages
        check_virtual_stages(layers, pipeline, schedules, split)
    else:  # searched degrees: interleaving left out where it cannot split them, and said
        left_out += unheld_interleaving(layers, pipeline, schedules, split, asked_chunks)
    expert = expert_degrees(request, gpus, nodes_of, expert, info)
    kinds = set(DATA_KINDS if data is None else data)
    sizes = None if micro_batch is None else set(micro_batch)
    if sizes is not None and (not sizes or min(sizes) < 1):
        raise UsageError(f"micro_batch {sorted(sizes)}: give one or more sizes of 1 or more")
    if options.optimizer == "none":  # no optimizer state to shard: ZeRO-1 is DDP
        if data is not None and "zero1" in kinds:
            raise UsageError("--data zero1 shards the optimizer state, and --optimizer none has none: use ddp")
        kinds.discard("zero1")
    if token_dispatcher not in TOKEN_DISPATCHERS:
        raise UsageError(f"invalid --dispatcher {token_dispatcher!r}; valid: {', '.join(TOKEN_DISPATCHERS)}")
    if token_dispatcher != "alltoall" and data is not None and not kinds & {"ddp", "zero1"}:
        raise UsageError(f"--dispatcher {token_dispatcher} is Megatron-LM's flex dispatcher, which runs beside ddp "
                         f"or zero1: --data {','.join(sorted(kinds))} has neither")
    if expert_overlap and data is not None and not kinds & {"ddp", "zero1"}:
        raise UsageError(f"--ep-overlap is Megatron-LM's --overlap-moe-expert-parallel-comm, which runs beside ddp "
                         f"or zero1: --data {','.join(sorted(kinds))} has neither")
    check_optimizer_states(optimizer_states, options, kinds if data is not None else None)
    if grad_reduce_in_fp32:
        check_fp32_gradients(optimizer_states, options, kinds if data is not None else None)
        if data is None:  # the only engine that keeps them: a search of the others would not honour the flag
            kinds = {"zero1"}
            left_out.append("--grad-reduce-in-fp32: ZeRO-1 layouts only (fp32 main gradients are Megatron-LM's "
                            "distributed optimizer's; ddp, fsdp and hsdp reduce in the model's dtype)")
    experts = 0
    if info is not None:
        from nnperf.trace.parallel.expert import has_experts

        experts = has_experts(info[0])
    if framework is not None:
        settings = [flag for flag, on in (("--tp-comm-overlap", tp_comm_overlap),
                                          ("--cross-entropy-loss-fusion", loss_fusion),
                                          (f"--dispatcher {token_dispatcher}", token_dispatcher != "alltoall"),
                                          (f"--optimizer-states {optimizer_states}", optimizer_states != "fp32"),
                                          ("--grad-reduce-in-fp32", grad_reduce_in_fp32),
                                          ("--ep-overlap", expert_overlap),
                                          ("--etp 1", expert_tensor == 1)) if on]
        kinds = framework_kinds(framework, kinds, data is not None, settings, bool(experts) and max(tensor) > 1)
    split_chosen = expert_tensor is not None  # the user's --etp: no other split tried
    fixed_tensor = sorted(set(tensor)) if tensor is not None else []
    if expert_tensor not in (None, 1) and fixed_tensor == [expert_tensor]:
        expert_tensor = None  # the tensor degree itself: Megatron-Core's default split
    if expert_tensor not in (None, 1):
        at_tp = f", {fixed_tensor[0]} (the --tp degree: the default split)" if len(fixed_tensor) == 1 and fixed_tensor[0] > 1 else ""
        raise UsageError(f"--etp {expert_tensor}: valid: auto (Megatron-Core's default: each expert split over the "
                         "tensor-parallel ranks, folded whole where the data-parallel ranks cannot hold the expert "
                         f"group), 1 (each expert whole on a rank){at_tp}")

    wanted = set(SEARCHED_CHECKPOINTS if checkpoints is None else checkpoints)
    levels = tuple(i for i, level in enumerate(CHECKPOINTS) if level in wanted)
    if info is not None:
        if not experts and (options.moe_load is not None or options.moe_capacity_factor is not None):
            asked = "--moe-load" if options.moe_load is not None else "--moe-capacity-factor"
            raise UsageError(f"{asked} spreads the tokens over a mixture of experts, and the model has no experts: "
                             "drop it, or plan a model with experts")
        if expert_overlap and not experts:
            raise UsageError("--ep-overlap overlaps a mixture of experts' all-to-alls, and the model has no experts: "
                             "drop it, or plan a model with experts")
        if experts and min(tensor) > 1 and not kinds & {"ddp", "zero1"}:
            raise UsageError(f"--tp {listed(tensor)} with --data {','.join(sorted(kinds))}: a mixture of experts with "
                             "tensor parallelism is planned as Megatron-LM runs it, beside ddp or zero1; torchtitan's "
                             "expert tensor parallelism (fsdp, hsdp) is not modelled")
        check_expert_degrees(gpus, nodes_of, global_batch, tensor=tensor, pipeline=pipeline, context=context,
                             expert=expert, kinds=kinds, expert_count=experts, layers=layers,
                             schedules=schedules, split=split, expert_tensor=expert_tensor)
    if expert_overlap and options.amp not in AMP_DTYPES and options.dtype not in AMP_DTYPES:
        # TransformerConfig.__post_init__: "overlap_moe_expert_parallel_comm is only supported with
        # bf16 or fp16 model"
        raise UsageError("--ep-overlap is Megatron-LM's --overlap-moe-expert-parallel-comm, which Megatron-Core runs "
                         f"with a bf16 or fp16 model only, and this plan is {options.amp or options.dtype or 'fp32'}: "
                         "add --amp bf16 (or --dtype bf16), or drop --ep-overlap")

    def runnable(e: Execution) -> bool:
        # the asked engines; experts split over tensor-parallel ranks as Megatron-LM splits them,
        # beside its data parallelism (DDP, ZeRO-1) and sequence parallelism
        # (``trace.parallel.expert_tensor``)
        return ((e.data_parallel == 1 or e.data in kinds) and (not experts or e.carries_split_experts)
                and runs_layout(framework, e))

    check_async_tp(async_tp, options, framework, sequence_parallel, tensor)
    if sequence_parallel is False and tp_comm_overlap:
        raise UsageError("--tp-comm-overlap overlaps sequence parallelism's collectives: it needs sequence "
                         "parallelism (drop --no-sequence-parallel)")

    if sequence_parallel is False and experts and min(tensor) > 1:
        raise UsageError("--no-sequence-parallel: a mixture of experts with tensor parallelism needs sequence "
                         "parallelism, as Megatron-Core requires; give --tp 1, or drop --no-sequence-parallel")

    def sequenced(e: Execution) -> Execution:
        return replace(e, sequence_parallel=False) if sequence_parallel is False else e

    def pinned(e: Execution) -> bool:
        """Whether the layout can run as the user pinned sequence parallelism (a mixture of
        experts with tensor parallelism runs with it only)."""
        return sequence_parallel is not False or not experts or e.tensor == 1

    def dispatched(e: Execution) -> bool:
        """Whether the layout can send its tokens as asked (DeepEP: Megatron-LM's flex dispatcher)."""
        return token_dispatcher == "alltoall" or e.expert == 1 or e.replicates_parameters

    def engines(found: list[Execution]) -> list[Execution]:
        return [_with_async_tp(replace(_with_megatron_flags(sequenced(e), tp_comm_overlap, loss_fusion,
                                                            token_dispatcher, optimizer_states,
                                                            grad_reduce_in_fp32, expert_overlap),
                                       framework=framework), async_tp)
                for e in found
                if runnable(e) and pinned(e) and dispatched(e) and (sizes is None or e.micro_batch in sizes)]

    if sizes is not None:  # before any trace: sizes no layout of these degrees runs are one line
        left_out += check_micro_batches(sizes, [
            e for e in layouts(gpus, nodes_of, global_batch, tensor=tensor, pipeline=pipeline, schedules=schedules,
                               layers=layers, context=context, expert=expert, split=split,
                               expert_tensor=expert_tensor) if runnable(e)])

    def without_sequence_parallel(e: Execution) -> list[Execution]:
        """``e`` without sequence parallelism, which a mixture of experts with tensor
        parallelism needs (none where the user pinned sequence parallelism either way)."""
        if experts or e.tensor == 1 or sequence_parallel is not None:
            return []
        return [replace(e, sequence_parallel=False, tp_comm_overlap=False, async_tp=False)]

    def experts_whole(e: Execution) -> list[Execution]:
        """``e`` with each expert whole on a rank, its expert group folded over the tensor-parallel
        ranks (Megatron-LM's --expert-tensor-parallel-size 1, as DeepSeek-V3's and Qwen3's recipes
        run), where ``e`` splits them by default and its degrees fold; none where the user chose
        the split."""
        if split_chosen or e.expert == 1 or e.tensor == 1 or e.folds_experts:
            return []
        whole = replace(e, expert_tensor=1)
        return [whole] if whole.folds_experts else []

    first = engines(layouts(gpus, nodes_of, global_batch, tensor=tensor,
                            pipeline=[1] if 1 in pipeline else pipeline[:1], schedules=schedules, layers=layers,
                            context=context, expert=expert, reshard=reshard, split=split,
                            expert_tensor=expert_tensor))
    cache = RoleCache()  # every role the passes trace, each pass's workers starting from it
    results = _in_workers(request, options, gpu, cluster, layers,
                          [[e for e in first if e.tensor == tp] for tp in tensor], cache, levels=levels)
    deeper = [p for p in pipeline if p > 1 and p not in {e.execution.pipeline for e in results}]
    if deeper:
        fitting = sorted((p for p in results if p.fits), key=lambda p: p.step_s)
        best_tp = fitting[0].execution.tensor if fitting else max(tensor)
        second = engines(layouts(gpus, nodes_of, global_batch, tensor=[best_tp], pipeline=deeper,
                                 schedules=schedules, layers=layers, context=context, expert=expert, split=split,
                                 expert_tensor=expert_tensor))
        # one engine (FSDP where it runs these layouts; else the first that does: a mixture of
        # experts beside tensor parallelism runs ZeRO-1 or DDP only) and pipelines without data
        # parallelism at every pipeline shape; the other engines at the shape it does best with:
        # the degree, schedule and chunks that set a pipeline's bubble are the same whichever
        # engine reduces its gradients
        leader = next((k for k in ("fsdp", "zero1", "ddp", "hsdp") if any(e.data == k for e in second)), None)
        narrowed = leader is not None and len({e.data for e in second}) > 1
        lead = [e for e in second if not narrowed or e.data == leader or e.data_parallel == 1]
        more = _in_workers(request, options, gpu, cluster, layers,
                           [[e for e in lead if e.pipeline == pp] for pp in deeper], cache,
                           fitting[0].step_s if fitting else None, same_work(results), levels)
        results += more
        piped = sorted((p for p in more if p.fits and not p.time_bound and p.execution.data == leader),
                       key=lambda p: p.step_s)
        if narrowed and piped:
            shape = _pipeline_shape(piped[0].execution)
            # each other engine beside the leader's members of that shape, searched where it fits
            # (its roles are the last pass's, in the cache: not traced again), one engine per
            # task so that the workers share them
            rest = [e for e in second if _pipeline_shape(e) == shape and (e.data == leader or e not in lead)]
            others = sorted({e.data for e in rest if e.data != leader})
            best = min((p for p in results if p.fits and not p.time_bound), key=lambda p: p.step_s, default=None)
            fastest = best.step_s if best else None
            # the fastest so far without sequence parallelism, evaluated beside them: the winner
            # (below) most often, whose roles are then traced already
            plain = without_sequence_parallel(best.execution) if best else []
            extra = _in_workers(request, options, gpu, cluster, layers,
                                [[e for e in rest if e.data in (leader, kind)] for kind in others], cache, fastest,
                                same_work(results), levels, ahead=plain)
            results += [p for p in extra if p.execution.data != leader]
    if not results:
        reason = why_no_layout(gpus, nodes_of, global_batch, tensor, pipeline, context, schedules, kinds, sizes)
        if reason:
            raise UsageError(f"no layout of {request_name(request)} on {gpus} GPUs: {reason}")
        raise UsageError(
            f"no layout of {request_name(request)} on {gpus} GPUs with tensor degrees {listed(tensor)}, "
            f"pipeline degrees {listed(pipeline)}, context degrees {listed(context)}, expert degrees "
            f"{listed(expert)} and data parallelism {', '.join(k for k in DATA_KINDS if k in kinds)}: the global batch "
            f"{global_batch} must divide over the data-parallel ranks (GPUs / (tp x pp x cp)), stages must "
            "split the layers" + (", and an expert degree above 1 must divide the data-parallel ranks (ddp, zero1) "
                                  "or the shard group (fsdp, hsdp, without tensor parallelism), without context "
                                  "parallelism"
                                  if max(expert) > 1 else "")
            + "; try other degrees or --global-batch a multiple of the GPU count")
    slower = [p for p in results if p.time_bound]
    results = [p for p in results if not p.time_bound]
    ranked = sorted((p for p in results if p.fits), key=lambda p: p.step_s)
    # the winner's degrees without sequence parallelism, or with its experts kept whole
    winner = ranked[0].execution if ranked else None
    others = [*without_sequence_parallel(winner), *experts_whole(winner)] if winner else []
    results += [evaluate(request, options, other, gpu, cluster, layers=layers, cache=cache) for other in others]
    ranked = sorted((p for p in results if p.fits), key=lambda p: p.step_s)
    rejected = [p for p in results if not p.fits]
    for p in rejected:
        at_least = "at least " if p.memory_bound else ""
        p.reason = f"does not fit: {at_least}{p.memory_bytes / 2**30:.1f} GiB > {capacity(gpu) / 2**30:.1f} GiB"
        if p.memory_bound:
            p.reason += f" ({p.memory_bound}; not traced)"
    if ranked:
        best = ranked[0]
        best.reason = why(best, ranked[1:])
        for p in ranked[1:]:
            p.reason = f"slower by {p.step_s / best.step_s - 1:.1%}"
        for p in slower:
            p.reason = (f"slower by at least {p.step_s / best.step_s - 1:.1%}: at least {p.step_s * 1e3:.2f} ms "
                        f"({p.time_bound}; not traced further)")
        rejected += slower
    names = {level: name for name, level in CHECKPOINT_NAMES.items()}
    search = {"tensor": list(tensor), "pipeline": list(pipeline), "context": context, "expert": list(expert),
              "schedules": list(schedules), "virtual_stages": list(split.virtual),
              "first_stage_layers": split.first, "last_stage_layers": split.last,
              "data": [k for k in DATA_KINDS if k in kinds],
              "checkpoint": [names[CHECKPOINTS[i]] for i in levels],
              "reshard_after_forward": sorted(set(reshard), reverse=True), "tp_comm_overlap": tp_comm_overlap,
              "async_tp": async_tp,
              "loss_fusion": loss_fusion, "micro_batch": None if sizes is None else sorted(sizes),
              "expert_tensor": expert_tensor, "token_dispatcher": token_dispatcher, "expert_overlap": expert_overlap,
              "optimizer_states": optimizer_states, "grad_reduce_in_fp32": grad_reduce_in_fp32}
    if async_tp and results and not any(p.execution.async_tp for p in results):
        left_out.append("--async-tp: no layout searched is one torch runs with tensor and sequence "
                        "parallelism (fsdp or hsdp beside --tp, or --tp alone): it applies to none of them")
    if grad_reduce_in_fp32 and any(p.execution.data_parallel == 1 for p in results):
        left_out.append(f"layouts without data parallelism reduce no gradients: they keep them in {options.dtype} "
                        "(--grad-reduce-in-fp32 is ZeRO-1's)")
    return Plan(request_name(request), gpu, cluster, gpus, global_batch, ranked, rejected,
                left_out + notes(request, options, results, layers) + routing_note(info, options), cache.traces, layers,
                options,
                dict(request.overrides), request.seq_len or (info[2] if info else None), search)


def check_optimizer_states(name: str, options: TraceOptions, kinds: set[str] | None) -> None:
    """One line for optimizer states that no layout asked for can keep (``kinds``: the
    data-parallel engines the user named, None: the default search)."""
    states = OPTIMIZER_STATES.get(name)
    if states is None:
        raise UsageError(f"invalid --optimizer-states {name!r}; valid: {', '.join(OPTIMIZER_STATES)}")
    if states.name == "fp32":
        return
    if kinds is not None and "zero1" not in kinds:
        raise UsageError(f"--optimizer-states {name} is a distributed optimizer's, which runs as zero1: --data "
                         f"{','.join(sorted(kinds))} has none")
    if options.optimizer not in ("adam", "adamw"):
        raise UsageError(f"--optimizer-states {name} keeps Adam's moments in {states.moments}: it needs --optimizer "
                         f"adamw or adam, not {options.optimizer}")
    if states.main is None and options.dtype != states.moments:
        raise UsageError(f"--optimizer-states {name} updates the model's own parameters, in {states.moments}: it "
                         f"needs --dtype {states.moments}" + (f" (not --amp {options.amp})" if options.amp else ""))


def check_fp32_gradients(optimizer_states: str, options: TraceOptions, kinds: set[str] | None) -> None:
    """One line where fp32 main gradients (``Execution.grad_reduce_in_fp32``) cannot apply: they
    are ZeRO-1's, beside a 16-bit model, handed to fp32 main parameters."""
    if options.dtype not in ("bf16", "fp16"):
        raise UsageError("--grad-reduce-in-fp32 keeps fp32 main gradients beside a 16-bit model: it needs --dtype "
                         "bf16 or fp16" + (f" (--amp {options.amp} keeps fp32 weights, and fp32 gradients with them)"
                                           if options.amp else f" (an {options.dtype} model's gradients are {options.dtype} already)"))
    if options.optimizer == "none":
        raise UsageError("--grad-reduce-in-fp32 hands fp32 gradients to a distributed optimizer's main parameters, "
                         "and --optimizer none has none")
    if kinds is not None and "zero1" not in kinds:
        raise UsageError(f"--grad-reduce-in-fp32 is Megatron-LM's distributed optimizer's, which runs as zero1: "
                         f"--data {','.join(sorted(kinds))} has none")
    if OPTIMIZER_STATES[optimizer_states].main is None:
        raise UsageError(f"--grad-reduce-in-fp32 hands fp32 gradients to fp32 main parameters, and --optimizer-states "
                         f"{optimizer_states} keeps none: valid: "
                         + ", ".join(n for n, s in OPTIMIZER_STATES.items() if s.main is not None))


#: Processes a plan's searches run in (default: 2 where a fork is safe, else 1).
WORKERS_ENV = "NNPERF_PLAN_WORKERS"


@dataclass(frozen=True)
class _Task:
    """What a forked worker runs (inherited, nothing pickled): ``_search`` of ``group`` from the
    roles ``known``, or (``exact``) the evaluation of its layouts as they are, for the roles it
    traces."""

    request: ModelRequest
    options: TraceOptions
    gpu: GPU
    cluster: Cluster
    layers: int | None
    group: list[Execution]
    slower_than: float | None
    work: dict[tuple[Any, ...], list[Planned]] | None
    levels: tuple[int, ...]
    known: dict[Any, Any]
    exact: bool = False


_TASKS: list[_Task] = []


def _pipeline_shape(execution: Execution) -> tuple[Any, ...]:
    """What sets a pipeline's bubble: its degree, schedule, chunks per rank and split."""
    e = execution
    return e.pipeline, e.pipeline_schedule, e.virtual_stages, e.first_stage_layers, e.last_stage_layers, e.context


def _in_workers(request: ModelRequest, options: TraceOptions, gpu: GPU, cluster: Cluster, layers: int | None,
                groups: list[list[Execution]], cache: RoleCache, slower_than: float | None = None,
                work: dict[tuple[Any, ...], list[Planned]] | None = None,
                levels: tuple[int, ...] = SEARCHED_LEVELS, ahead: Iterable[Execution] = ()) -> list[Planned]:
    """``_search`` of each group of candidates, in forked worker processes where that is safe:
    each task starts from the roles ``cache`` holds and traces the others into a cache of its
    own; the results come back, and the roles traced are adopted by ``cache``. ``ahead``:
    layouts evaluated as they are beside the searches, for the roles they trace (what a later
    ``evaluate`` on ``cache`` will need; their results are not returned)."""
    import os
    import sys

    from nnperf.search.fit_parallel import fork_is_safe, in_processes

    groups = [g for g in groups if g]
    wanted = os.environ.get(WORKERS_ENV)
    workers = int(wanted) if wanted and wanted.isdigit() else min(2, os.cpu_count() or 1)
    known = cache.known
    _TASKS[:] = [_Task(request, options, gpu, cluster, layers, g, slower_than, work, levels, known) for g in groups]
    _TASKS.extend(_Task(request, options, gpu, cluster, layers, [e], None, None, levels, known, exact=True)
                  for e in ahead)
    workers = min(workers, len(_TASKS))
    progress.expect(sum(len({shape_key(e) for e in g}) for g in groups))  # ``_search``'s units
    if workers <= 1 or not sys.platform.startswith("linux") or not fork_is_safe():
        outputs = [_run_task(i) for i in range(len(_TASKS))]
    else:  # forked workers inherit the tasks; a Ctrl-C or SIGTERM stops them (``in_processes``)
        import_engines()  # once here, not in every worker
        # the largest groups first, so that the last one to start is a small one; of groups as
        # large, the deepest pipeline first, likely the longest (it holds the least per GPU: fewer
        # of its layouts are ruled out untraced, more stage roles of each traced); the order
        # changes the wall time only, each task starting from the same known roles
        largest_first = sorted(range(len(_TASKS)), key=lambda i: (-len(_TASKS[i].group),
                                                                  -max(e.pipeline for e in _TASKS[i].group)))
        outputs = in_processes(_run_task, largest_first, workers, "fork")
    for _, made in outputs:
        cache.adopt(made)
    return [p for planned, _ in outputs for p in planned]


def _run_task(index: int) -> tuple[list[Planned], dict[Any, Any]]:
    t = _TASKS[index]
    cache = RoleCache(t.known)
    if t.exact:
        for execution in t.group:
            evaluate(t.request, t.options, execution, t.gpu, t.cluster, layers=t.layers, cache=cache)
        return [], cache.made
    return (_search(t.request, t.options, t.group, t.gpu, t.cluster, t.layers, cache, t.slower_than, t.work, t.levels),
            cache.made)


def _search(request: ModelRequest, options: TraceOptions, candidates: list[Execution], gpu: GPU,
            cluster: Cluster, layers: int | None, cache: RoleCache, slower_than: float | None = None,
            work: dict[tuple[Any, ...], list[Planned]] | None = None,
            allowed: tuple[int, ...] = SEARCHED_LEVELS) -> list[Planned]:
    """Per group (one ``shape_key``), the largest micro-batch that fits, found by bisection
    (memory only grows with the micro-batch), without checkpointing and then with each
    checkpointing level in turn while it lets a larger micro-batch fit: recomputation only
    pays for itself through the larger micro-batch it makes room for, so a level is tried
    only where the one before it could not fit the whole local batch at once, and only for
    micro-batches larger than the one that level fitted; a pipeline's smaller micro-batches too,
    while each is faster (``_smaller_while_faster``: a smaller bubble). Which of them is fastest
    the ranking decides.

    Data-parallel kinds dominate one another in memory: HSDP, ZeRO-1 and DDP hold at least FSDP's
    per-GPU state with the same activations, so they are searched only where FSDP fits, at
    FSDP's checkpointing levels and micro-batches or smaller; a layout they cannot fit is not
    traced, nor one whose model states alone cannot fit (``search.plan.states``, from FSDP's
    trace). ``slower_than``: the fastest step found so far, below which a pipeline's first stage
    must keep it to be traced to the end (``search.plan.pipeline``), and its GPUs' work (``work``,
    ``same_work``) to be traced at all. ``allowed``: the indices of ``CHECKPOINTS`` the search
    may use, in that order."""
    groups: dict[tuple[Any, ...], list[Execution]] = {}
    for execution in candidates:
        groups.setdefault(shape_key(execution), []).append(execution)
    order = sorted(groups, key=lambda k: k[0] != "fsdp")  # FSDP first: it bounds the others
    fsdp_fits: dict[tuple[Any, ...], dict[int, Planned]] = {}  # rest of the key -> fit per checkpoint level
    results: list[Planned] = []
    for key in progress.counted(order):
        members = sorted(groups[key], key=lambda e: -e.micro_batch)
        rest = key[2:]
        levels: Iterable[int] = allowed
        largest: dict[int, int] = {}  # level -> the largest micro-batch FSDP fitted there
        if key[0] != "fsdp" and any(k[0] == "fsdp" and k[2:] == rest for k in groups):
            sibling_fits = fsdp_fits.get(rest)
            if not sibling_fits:
                continue  # FSDP of this shape fits nowhere: neither does HSDP/DDP
            levels = sorted(sibling_fits)
            largest = {level: fit.execution.micro_batch for level, fit in sibling_fits.items()}
            sibling = sibling_fits[levels[0]]
            first = [e.with_checkpoint(CHECKPOINTS[levels[0]]) for e in members
                     if e.micro_batch <= largest[levels[0]]]
            bound = states_bound(sibling, sibling.execution.shard, first[0], options.optimizer) if first else None
            if bound is not None and bound > capacity(gpu):
                results.append(Planned(first[0], memory_bytes=bound, memory_bound=STATES_BOUND))
                continue
        above = 0  # micro-batches at or below this one are not worth recomputing for
        for level in levels:
            tried = [e.with_checkpoint(CHECKPOINTS[level]) for e in members
                     if above < e.micro_batch <= largest.get(level, e.micro_batch)]
            if not tried:
                continue
            fit = _first_fit(tried, request, options, gpu, cluster, layers, cache, results, slower_than, work)
            if fit is None:
                continue
            if fit.execution.pipeline > 1:
                _smaller_while_faster(tried, fit, request, options, gpu, cluster, layers, cache, results,
                                      slower_than, work)
            if key[0] == "fsdp":
                fsdp_fits.setdefault(rest, {})[level] = fit
            above = fit.execution.micro_batch
            if above == members[0].micro_batch:
                break  # the whole local batch at once: more recomputation only slows it down
    return results


def _smaller_while_faster(members: list[Execution], fit: Planned, request: ModelRequest, options: TraceOptions,
                          gpu: GPU, cluster: Cluster, layers: int | None, cache: RoleCache, results: list[Planned],
                          slower_than: float | None = None,
                          work: dict[tuple[Any, ...], list[Planned]] | None = None) -> None:
    """A pipeline's smaller micro-batches after the largest that fits, while each is faster
    than the one before: more of them shrink its bubble (1F1B's ``(p - 1) / m`` of the step),
    which can outweigh their less efficient kernels (8 stages, 16 samples a rank: micro-batches
    of 2 leave 7 of 15 slots idle, of 1 only 7 of 23), so the largest that fits need not be
    the fastest. They fit where the larger one does (memory only grows with the micro-batch).
    Each is added to ``results``."""
    best = fit
    for execution in (e for e in members if e.micro_batch < fit.execution.micro_batch):
        planned = _bounded_or_evaluated(execution, request, options, gpu, cluster, layers, cache, slower_than, work)
        results.append(planned)
        if not planned.fits or planned.time_bound or planned.step_s >= best.step_s:
            return
        best = planned


def _first_fit(members: list[Execution], request: ModelRequest, options: TraceOptions, gpu: GPU,
               cluster: Cluster, layers: int | None, cache: RoleCache, results: list[Planned],
               slower_than: float | None = None, work: dict[tuple[Any, ...], list[Planned]] | None = None) -> Planned | None:
    """The first of ``members`` (largest micro-batch first) that fits, by bisection; the layouts
    that do not fit and the one found are added to ``results`` (a fitting one with more
    accumulation than needed is only slower)."""
    low, high, best = 0, len(members) - 1, None
    while low <= high:
        mid = (low + high) // 2
        planned = _bounded_or_evaluated(members[mid], request, options, gpu, cluster, layers, cache, slower_than,
                                        work)
        if planned.fits:
            best, high = planned, mid - 1
        else:
            results.append(planned)
            low = mid + 1
    if best is not None:
        results.append(best)
    return best


def _bounded_or_evaluated(execution: Execution, request: ModelRequest, options: TraceOptions, gpu: GPU,
                          cluster: Cluster, layers: int | None, cache: RoleCache, slower_than: float | None,
                          work: dict[tuple[Any, ...], list[Planned]] | None) -> Planned:
    """``execution`` bounded from a traced layout doing the same work per GPU where that shows it
    cannot win or fit (``work_bound``), else evaluated (its pipeline pruned past ``slower_than``)."""
    bound = work and work_bound(execution, work, slower_than, capacity(gpu), layers, options)
    return bound or evaluate(request, options, execution, gpu, cluster, layers=layers, cache=cache, prune=True,
                             slower_than=slower_than)


def check_async_tp(async_tp: bool, options: TraceOptions, framework: str | None, sequence_parallel: bool | None,
                   tensor: Iterable[int] | None) -> None:
    """One line where --async-tp cannot apply to any layout asked for: torchtitan runs it with
    its compiled blocks only (``parallelize_llama``: "Async TP requires torch.compile"), beside
    sequence parallelism, over tensor parallelism, as torch runs a layout."""
    if not async_tp:
        return
    if options.pointwise != "fused":
        raise UsageError(ASYNC_TP_NEEDS_COMPILE)
    if framework == "megatron":
        raise UsageError("--async-tp is torch's async tensor parallelism (torchtitan's) and --framework megatron "
                         "plans Megatron-LM's layouts: give --framework torch or auto, or Megatron-LM's own "
                         "--tp-comm-overlap")
    if sequence_parallel is False:
        raise UsageError("--async-tp pipelines sequence parallelism's collectives: it needs sequence parallelism "
                         "(drop --no-sequence-parallel)")
    if tensor is not None and max(tensor) < 2:
        raise UsageError("--async-tp pipelines tensor parallelism's collectives: give --tp above 1 (or --tp auto)")


def _with_async_tp(execution: Execution, async_tp: bool) -> Execution:
    """``execution`` with torch's async tensor parallelism where asked and it applies: tensor
    parallelism with sequence parallelism, as torch runs the layout (not ``megatron_layout``)."""
    if async_tp and execution.tensor > 1 and execution.sequence_parallel and not execution.megatron_layout:
        return replace(execution, async_tp=True)
    return execution


def _with_megatron_flags(execution: Execution, tp_comm_overlap: bool, loss_fusion: bool,
                         token_dispatcher: str = "alltoall", optimizer_states: str = "fp32",
                         grad_reduce_in_fp32: bool = False, expert_overlap: bool = False) -> Execution:
    """``execution`` with Megatron-LM's --tp-comm-overlap, --cross-entropy-loss-fusion,
    --moe-token-dispatcher-type, optimizer states, fp32 main gradients and
    --overlap-moe-expert-parallel-comm where asked and they apply (DDP or ZeRO-1; the overlap
    beside sequence parallelism; the dispatcher beside expert parallelism; the states and the
    main gradients beside ZeRO-1; the expert overlap beside expert parallelism without a
    pipeline or with an interleaved one)."""
    if not execution.replicates_parameters:
        return execution
    overlap = tp_comm_overlap and execution.sequence_parallel
    overlap_experts = expert_overlap and execution.expert_overlap_refusal() is None
    return replace(execution, tp_comm_overlap=overlap or execution.tp_comm_overlap,
                   expert_overlap=overlap_experts or execution.expert_overlap,
                   loss_fusion=loss_fusion or execution.loss_fusion,
                   token_dispatcher=token_dispatcher if execution.expert > 1 else execution.token_dispatcher,
                   optimizer_states=optimizer_states if execution.shards_optimizer_only else execution.optimizer_states,
                   grad_reduce_in_fp32=(grad_reduce_in_fp32 and execution.shards_optimizer_only)
                   or execution.grad_reduce_in_fp32)
