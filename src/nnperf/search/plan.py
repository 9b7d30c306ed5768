"""``nnperf plan``: layouts of a model on N GPUs, each traced one rank role at a time.

A candidate ``Execution`` combines data parallelism (DDP; ZeRO-1, DDP with the optimizer state
sharded; FSDP2 full shard; HSDP sharded inside a node and replicated across), tensor parallelism (with sequence parallelism by
default, torchtitan's composition; without it for the winner's degree, for comparison),
pipeline parallelism (1F1B and interleaved 1F1B by default; GPipe and zero-bubble on request),
activation checkpointing (none, then selective, then full, only while a layout does not fit)
and gradient accumulation / micro-batches to reach the global batch. Each rank role of the
layout (the one rank of a data/tensor-parallel layout; the first, a middle and the last stage
of a pipeline) is traced with the real engines on a fake process group (``search.plan_rank``,
deep stacks from two shallow traces), timed on the GPU with its collectives on the cluster
beside the compute, and its memory predicted by the memory pass. A pipeline's step is the
replay of its schedule (``passes.pipeline_timeline``) from the traced per-action times, with
the bubble explicit. Layouts that fit are ranked by step time; the others are listed with
the reason.

Gradient accumulation without a pipeline: every micro-batch is timed as the traced one (with
its gradient synchronization); the optimizer runs once. DDP's ``no_sync`` micro-batches skip
their all-reduce, so for DDP (and ZeRO-1) this is an upper bound on the step. A pipeline's micro-batches
are traced ``p`` at a time (the schedules' in-flight peak for micro-batch counts that are
multiples of ``p``; GPipe: all of them) and the schedule replayed with all of them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from nnperf.errors import UsageError
from nnperf.hardware import GPU
from nnperf.hardware.cluster import Cluster
from nnperf.layout import Execution
from nnperf.passes.memory.capacity import capacity, fits
from nnperf.request import ModelRequest
from nnperf.search.memory_variants import apply_checkpointing
from nnperf.search.plan_pipeline import pipeline_step
from nnperf.search.plan_rank import SCALE_POINTS, RankCost, RoleCache, layers_of, scaled_cost
from nnperf.search.plan_states import WHAT as STATES_BOUND
from nnperf.search.plan_states import states_bound
from nnperf.trace.options import TraceOptions

#: Checkpointing levels the search tries, the selective one torchtitan's per-op policy so the
#: winner is one torchtitan runs (``report.engine_configs``).
CHECKPOINTS = (None, "selective-op", "full")
#: What a user may restrict the search to (``nnperf plan --data``, ``--checkpoint``): the
#: data-parallel engines, and the checkpointing levels by name ("none" for None).
DATA_KINDS = ("ddp", "zero1", "fsdp", "hsdp")
CHECKPOINT_NAMES = {"none": None, "selective-op": "selective-op", "full": "full"}
DEFAULT_SCHEDULES = ("1f1b", "interleaved-1f1b")
PIPELINE_DEGREES = (1, 2, 4, 8, 16)
INTERLEAVE = 2  # model chunks per rank of the interleaved schedules


@dataclass
class Planned:
    execution: Execution
    step_s: float = 0.0
    throughput: float = 0.0
    throughput_unit: str = "samples/s"
    mfu: float = 0.0
    memory_bytes: int = 0  # the device total per GPU: what nvidia-smi shows, the fit is judged on
    #: what the device total holds outside the caching allocator (the CUDA context): the rest is
    #: torch.cuda.max_memory_reserved(), what training frameworks log as memory
    context_bytes: int = 0
    fits: bool = False
    split: dict[str, Any] = field(default_factory=dict)
    state_bytes: dict[str, int] = field(default_factory=dict)
    collectives: dict[str, dict[str, float]] = field(default_factory=dict)  # kind -> count, bytes
    reason: str = ""
    pipeline: dict[str, Any] = field(default_factory=dict)  # bubble, in-flight micro-batches
    memory_bound: str = ""  # what memory_bytes counts when it is a lower bound (pruned unfit: not timed)
    time_bound: str = ""  # what step_s counts when it is a lower bound (pruned slower: not traced further)
    param_row_bytes: float = 0.0  # per-rank parameter row bytes (search.plan_states)
    #: the rank whose figures these are: the first of its role (a pipeline's critical stage),
    #: ZeRO-1's busiest (None: not known, a deep stack's busiest ZeRO-1 rank estimated from
    #: shallow traces, ``search.plan_zero``, or a ZeRO-1 layout ruled out by its states' bound)
    rank: int | None = 0
    loss_saved_bytes: int = 0  # what the loss keeps for backward (an eager cross entropy's copies of the logits)
    #: what one more block adds to the traced rank (``RankCost.per_block``): its persistent state
    #: (parameters and optimizer state, ``state.*``) and its saved activations (``same_work``)
    per_block: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"layout": self.execution.describe(), "execution": self.execution.to_json(),
                "step_time_s": self.step_s, "throughput": self.throughput,
                "throughput_unit": self.throughput_unit, "mfu": self.mfu,
                "memory_bytes": self.memory_bytes, "reserved_bytes": self.memory_bytes - self.context_bytes,
                "memory_is_lower_bound": bool(self.memory_bound),
                "step_time_is_lower_bound": bool(self.time_bound),
                "fits": self.fits, "time_split_s": self.split,
                "rank": self.rank, "per_rank_state_bytes": self.state_bytes, "collectives": self.collectives,
                "pipeline": self.pipeline, "reason": self.reason}


@dataclass
class Plan:
    model: str
    gpu: GPU
    cluster: Cluster
    gpus: int
    global_batch: int
    ranked: list[Planned]
    rejected: list[Planned]
    notes: list[str] = field(default_factory=list)
    traces: int = 0  # rank roles traced (the search's cost)
    layers: int | None = None  # repeated blocks of a built-in stack
    options: TraceOptions = field(default_factory=TraceOptions)  # the step every rank runs
    model_options: dict[str, Any] = field(default_factory=dict)  # -O overrides of a built-in model
    seq_len: int | None = None  # --seq, or a built-in model's default sequence
    #: the space searched, after the model's and the GPUs' rules: degrees per axis, schedules,
    #: data-parallel engines, checkpointing levels, FSDP resharding (``--json``'s "search")
    search: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"schema": "nnperf.plan/1", "model": self.model, "model_options": self.model_options,
                "seq_len": self.seq_len, "gpu": self.gpu.id,
                "cluster": self.cluster.to_json(), "gpus": self.gpus, "global_batch": self.global_batch,
                "options": self.options.to_json(), "search": self.search,
                "ranked": [p.to_json() for p in self.ranked],
                "rejected": [p.to_json() for p in self.rejected], "notes": self.notes,
                "traced_roles": self.traces}


def _nearest_gpu_counts(gpus: int, global_batch: int) -> str:
    valid = sorted({d for d in range(1, gpus * 2 + 1) if global_batch % d == 0}, key=lambda d: abs(d - gpus))[:2]
    return ", ".join(map(str, sorted(valid)))


def layouts(gpus: int, nodes_of: int, global_batch: int, *, tensor: Iterable[int] = (1,),
            pipeline: Iterable[int] = (1,), schedules: Iterable[str] = DEFAULT_SCHEDULES,
            layers: int | None = None, checkpoints: Iterable[str | None] = (None,),
            context: Iterable[int] = (1,), expert: Iterable[int] = (1,),
            reshard: Iterable[bool] = (True,)) -> list[Execution]:
    """Every layout of ``gpus`` GPUs over the given tensor and pipeline degrees (sequence
    parallel with TP), data parallelism over the rest, and the micro-batch splits of the global
    batch; with the defaults, the data-parallel layouts only. Grouped: within a group (one
    ``shape_key``) the micro-batch shrinks, so the first that fits is the group's best. An
    expert-parallel degree above 1 takes the FSDP/HSDP layouts whose shard group it divides,
    without tensor or context parallelism (``Execution._validate_expert``). ``reshard``: whether
    FSDP/HSDP frees a block's gathered parameters after its forward (FSDP2's
    ``reshard_after_forward``; pipelines keep them, as torchtitan's)."""
    out: list[Execution] = []
    expert = list(expert)
    for tp in tensor:
        for pp in pipeline:
            for cp in context:
                found = _layouts_of(gpus, nodes_of, global_batch, tp, pp, cp, schedules, layers, checkpoints,
                                    tuple(reshard))
                out += found
                out += [replace(e, expert=ep) for ep in expert if ep > 1 for e in found
                        if not e.replicates_parameters and e.shard % ep == 0 and e.tensor == e.context == 1]
    return out


def _layouts_of(gpus: int, nodes_of: int, global_batch: int, tp: int, pp: int, cp: int,
                schedules: Iterable[str], layers: int | None, checkpoints: Iterable[str | None],
                reshard: tuple[bool, ...] = (True,)) -> list[Execution]:
    """The layouts of one (tensor, pipeline, context) degree: data parallelism over the rest."""
    if gpus % (tp * pp * cp) or (tp > 1 and nodes_of % tp) or (cp > 1 and pp > 1):
        return []
    dp = gpus // (tp * pp * cp)
    if global_batch % dp:
        if tp == pp == cp == 1:
            low, high = global_batch // gpus * gpus, (global_batch // gpus + 1) * gpus
            batches = f"{low} or {high}" if low else str(high)
            raise UsageError(f"--global-batch {global_batch} does not divide over {gpus} GPUs; nearest global "
                             f"batches that do: {batches}; or GPU counts that divide it: "
                             f"{_nearest_gpu_counts(gpus, global_batch)}")
        return []
    out: list[Execution] = []
    for data, shard in _data_shapes(dp, tp * cp, pp, nodes_of):
        if cp > 1 and data in ("ddp", "zero1") and dp > 1:
            continue  # torchtitan shards over the data and context ranks together
        for checkpoint in checkpoints:
            common = {"world": gpus, "data": data, "shard": shard, "gpus_per_node": nodes_of,
                      "checkpoint": checkpoint, "tensor": tp, "sequence_parallel": tp > 1, "context": cp}
            for keep in sorted({not r for r in reshard} if data in ("fsdp", "hsdp") and pp == 1 else {False}):
                out.extend(_splits(common | ({"reshard_after_forward": False} if keep else {}), pp,
                                   global_batch // dp, schedules, layers))
    return out


def _data_shapes(dp: int, tp: int, pp: int, nodes_of: int) -> list[tuple[str, int]]:
    if dp == 1:
        return [("ddp", 1)]  # no data parallelism
    shapes = [("ddp", 1), ("zero1", 1)] if tp == pp == 1 else []
    shapes.append(("fsdp", dp))
    inside = max(1, nodes_of // tp)  # HSDP: shard inside a node, replicate across
    if 1 < inside < dp and dp % inside == 0:
        shapes.append(("hsdp", inside))
    return shapes


def _splits(common: dict[str, Any], pp: int, local: int, schedules: Iterable[str],
            layers: int | None) -> list[Execution]:
    if pp == 1:
        return [Execution(**common, micro_batch=local // a, grad_accum=a) for a in _divisors(local)]
    out = []
    for schedule in schedules:
        virtual = INTERLEAVE if schedule in ("interleaved-1f1b", "zero-bubble") else 1
        if layers is not None and layers % (pp * virtual):
            continue
        counts = range(1, local + 1) if schedule == "gpipe" else range(pp, local + 1, pp)
        for micro in counts:
            if local % micro == 0:
                out.append(Execution(**common, pipeline=pp, pipeline_schedule=schedule, virtual_stages=virtual,
                                     micro_batch=local // micro, grad_accum=micro,
                                     reshard_after_forward=False))  # torchtitan: no reshard under PP
    return out


def _divisors(n: int) -> list[int]:
    """Every gradient accumulation of a local batch of ``n`` (down to micro-batches of one),
    ascending: the search bisects over them, so a long list costs a few traces more."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def shape_key(execution: Execution) -> tuple[Any, ...]:
    """What a group of layouts shares: all but the micro-batch split and checkpointing."""
    e = execution
    return (e.data, e.shard, e.tensor, e.sequence_parallel, e.pipeline, e.pipeline_schedule, e.virtual_stages,
            e.context, e.expert, e.reshard_after_forward)


def prepare_for(execution: Execution) -> Any:
    """What the layout's activation checkpointing does to a built workload (None: nothing)."""
    if not execution.checkpoint:
        return None
    policy = execution.checkpoint if execution.checkpoint != "full" else False
    return lambda workload: apply_checkpointing(workload, selective=policy)


def evaluate(request: ModelRequest, options: TraceOptions, execution: Execution, gpu: GPU,
             cluster: Cluster, *, layers: int | None = None, cache: RoleCache | None = None,
             prune: bool = False, slower_than: float | None = None) -> Planned:
    """Trace, time and size one layout (``layers``: the depth of a built-in stack, to trace it
    shallow and extrapolate; ``cache``: traced roles shared by a search; ``prune``: a pipeline
    whose first stage alone cannot fit is left at that lower bound, untimed:
    ``search.plan_pipeline``)."""
    cache = cache or RoleCache()
    if execution.context > 1:
        from nnperf.search.plan_context import context_step

        info = _model_info(request, layers)
        seq = request.seq_len or (info[2] if info else None)
        if not seq:
            raise UsageError("context parallelism needs a sequence length (--seq)")
        return context_step(request, options, execution, gpu, cluster, layers, cache, prepare_for(execution), seq)
    if execution.pipeline > 1:
        return pipeline_step(request, options, execution, gpu, cluster, layers, cache, prepare_for(execution), prune,
                             slower_than)
    cost = scaled_cost(replace(request, batch=execution.micro_batch), options, execution, gpu, cluster, 0,
                       layers, cache, prepare_for(execution))
    accum = execution.grad_accum
    optimizer_s = cost.get("optimizer_s")

    def once_per_step(total: float, optimizer: float) -> float:
        """A micro-batch's figure over the accumulated step: the optimizer and gradient clipping
        run once (``trace.step.once_per_step``)."""
        return accum * (total - optimizer) + optimizer

    host = once_per_step(cost.get("host_s"), cost.get("optimizer_host_s"))
    compute = once_per_step(cost.get("compute_s"), optimizer_s)
    # the host's and the device's totals bound the accumulated step from below: a traced
    # micro-batch bound by one may be bound by the other once its optimizer share is taken out
    step = max(once_per_step(cost.get("step_s"), cost.get("once_span_s")), host, compute)
    planned = Planned(
        execution, step_s=step,
        throughput=cost.per_micro * accum * execution.data_parallel / step if step else 0.0,
        throughput_unit=cost.unit,
        mfu=cost.get("flops") * accum / step / cost.mfu_peak if step and cost.mfu_peak else 0.0,
        memory_bytes=int(cost.get("memory")), context_bytes=int(cost.get("mem_context")),
        split={"compute_s": compute,
               "recomputation_s": cost.get("recompute_s") * accum,
               "communication_s": cost.get("comm_s") * accum,
               "overlap_slowdown_s": cost.get("slowdown_s") * accum,
               "exposed_communication_s": {k: v * accum for k, v in cost.prefixed("exposed.").items() if v > 0},
               "host_s": host},
        state_bytes=state_bytes(cost), collectives=collective_counts(cost),
        param_row_bytes=cost.get("param_row_bytes"), loss_saved_bytes=int(cost.get("loss_saved")),
        per_block={k: cost.per_block[k] for k in _PER_BLOCK if k in cost.per_block}, rank=cost.rank,
    )
    planned.fits = fits(planned.memory_bytes, capacity(gpu))
    return planned


#: The per-block figures a layout keeps for ``work_bound``'s memory bound.
_PER_BLOCK = ("state.parameters", "state.optimizer_state", "saved_activations")


def state_bytes(cost: RankCost) -> dict[str, int]:
    return {k: round(v) for k, v in cost.prefixed("state.").items()}


def collective_counts(cost: RankCost) -> dict[str, dict[str, float]]:
    counts = cost.prefixed("count.")
    sizes = cost.prefixed("bytes.")
    return {k: {"count": round(counts[k]), "bytes": round(sizes.get(k, 0.0))} for k in counts}


def request_name(request: ModelRequest) -> str:
    return request.target if isinstance(request.target, str) else type(request.target).__name__


def search_axes(request: ModelRequest, gpus: int, nodes_of: int, layers: int | None,
                tensor: Iterable[int] | None, pipeline: Iterable[int] | None,
                model_info: tuple[Any, dict[str, Any], int | None] | None) -> tuple[list[int], list[int]]:
    """The tensor and pipeline degrees to try: what the user gave (checked: a degree that does
    not divide the model is one line), else every degree the model and the nodes allow.
    ``model_info``: ``_model_info(request, layers)``."""
    from nnperf.trace.parallel.pipeline import check_layers

    if tensor is not None:
        tensor = list(tensor)
        for tp in tensor:
            if tp > 1 and model_info is not None:
                from nnperf.trace.parallel.tensor import check_divisible

                check_divisible(model_info[0], model_info[1], tp, True, request.seq_len or model_info[2])
    elif model_info is None:
        tensor = [1]
    else:
        from nnperf.trace.parallel.tensor import valid_degrees

        try:
            tensor = valid_degrees(model_info[0], model_info[1], True, request.seq_len or model_info[2],
                                   min(nodes_of, gpus))
        except UsageError:
            tensor = [1]  # no tensor-parallel plan for this model
        tensor = [d for d in tensor if nodes_of % d == 0 and d & (d - 1) == 0]
    if pipeline is not None:
        pipeline = list(pipeline)
        for pp in pipeline:
            if pp > 1:
                if layers is None:
                    raise UsageError("pipeline parallelism needs a built-in gpt2 or llama model (a stage split)")
                check_layers(layers, pp)
    elif layers is None or model_info is None or not _pipelines(model_info[0]):
        pipeline = [1]
    else:
        pipeline = [p for p in PIPELINE_DEGREES if p <= gpus and layers % p == 0 and p < layers]
    return tensor, pipeline


def chunked_loss_axes(options: TraceOptions, tensor: Iterable[int] | None,
                      pipeline: Iterable[int] | None) -> tuple[Iterable[int] | None, Iterable[int] | None]:
    """A chunked loss (``trace.loss.ChunkedLoss``) runs the output projection in the loss, on a
    pipeline's last stage as torchtitan's ChunkedLossWrapper does; with tensor parallelism it
    runs split over the vocabulary with its inner cross entropy eager (``--loss chunked``), so
    ``chunked-compiled`` keeps the search to one tensor-parallel degree (``None``: auto) and
    refuses a degree the user asked for."""
    if options.loss != "chunked-compiled":
        return tensor, pipeline
    asked = [f"--tp {d}" for d in tensor or () if d > 1]
    if asked:
        raise UsageError(f"--loss chunked-compiled with {', '.join(asked)} is not modelled (the inner loss "
                         "compiled over a split vocabulary); give --tp 1, or --loss chunked for tensor "
                         "parallelism")
    return [1], pipeline


def _listed(degrees: Iterable[int]) -> str:
    return ",".join(map(str, degrees))


def check_degrees(gpus: int, nodes_of: int, tensor: Iterable[int] | None, pipeline: Iterable[int] | None,
                  context: Iterable[int], expert: Iterable[int] | None = None) -> None:
    """A degree the user asked for that no layout of ``gpus`` GPUs can have is one line with the
    valid ones (it used to leave nothing to search, or only the other axes' layouts): tensor
    parallelism stays inside a node, so it divides the GPUs per node and the GPU count; pipeline
    and context degrees divide the GPU count."""
    def divisors(n: int) -> str:
        return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)

    per_node = math.gcd(gpus, nodes_of)
    for tp in tensor or ():
        if tp < 1 or per_node % tp:
            raise UsageError(f"--tp {tp}: tensor parallelism stays inside a node, so its degree divides the "
                             f"{nodes_of} GPUs per node and the {gpus} GPUs; valid: {divisors(per_node)}")
    for option, degrees in (("--pp", pipeline or ()), ("--cp", context), ("--ep", expert or ())):
        for d in degrees:
            if d < 1 or gpus % d:
                raise UsageError(f"{option} {d} does not divide the {gpus} GPUs; valid: {divisors(gpus)}")


def expert_degrees(request: ModelRequest, gpus: int, nodes_of: int, expert: Iterable[int] | None,
                   model_info: tuple[Any, dict[str, Any], int | None] | None) -> list[int]:
    """The expert-parallel degrees to try: what the user gave (checked against the model's
    expert count), else for a mixture-of-experts model every power of two that divides its
    experts and stays inside a node (torchtitan keeps the expert all-to-all on NVLink).
    ``model_info``: ``_model_info(request, layers)``."""
    from nnperf.trace.parallel.expert import has_experts

    experts = has_experts(model_info[0]) if model_info is not None else 0
    if expert is not None:
        expert = list(expert)
        if any(ep > 1 for ep in expert):
            if model_info is None:
                raise UsageError("expert parallelism (--ep) needs a built-in mixture-of-experts model "
                                 "(mixtral-8x7b, or llama-7b -O n_experts=N)")
            if not experts:
                raise UsageError(f"--ep: {request_name(request)} has no experts; expert parallelism needs a "
                                 "mixture-of-experts model (mixtral-8x7b, or llama-7b -O n_experts=N)")
            for ep in expert:
                if experts % ep:
                    valid = ", ".join(str(d) for d in range(1, experts + 1) if experts % d == 0)
                    raise UsageError(f"--ep {ep} does not divide the model's {experts} experts; valid: {valid}")
        return expert
    if not experts:
        return [1]
    return [d for d in (1, 2, 4, 8, 16, 32, 64) if experts % d == 0 and d <= min(gpus, nodes_of)]


def _pipelines(model: Any) -> bool:
    from nnperf.trace.parallel.pipeline import split_of

    try:
        split_of(model)
    except UsageError:
        return False
    return True


def _default_batch(request: ModelRequest) -> int:
    """Samples per GPU when neither --batch nor --global-batch is given: a built-in model's
    default batch (``nnperf models``), else one."""
    from nnperf.zoo import find_model

    spec = find_model(request.target) if isinstance(request.target, str) else None
    return spec.default_batch if spec else 1


def _model_info(request: ModelRequest, layers: int | None) -> tuple[Any, dict[str, Any], int | None] | None:
    """A built-in model's module (one block, on the meta device), config and sequence length
    (``layers``: ``layers_of(request)``)."""
    if not isinstance(request.target, str) or ":" in request.target:
        return None
    import torch

    from nnperf.zoo import get_model

    spec = get_model(request.target)
    overrides = {**request.overrides, "n_layer": 1} if "n_layer" in spec.options else dict(request.overrides)
    with torch.device("meta"):
        workload = spec.build(1, request.seq_len, **overrides)
    config = workload.info.get("config", {})
    dense = config.get("n_dense_layers", 0) if config.get("n_experts") else 0
    if dense > SCALE_POINTS[0] and (layers or 0) > SCALE_POINTS[-1]:
        # both shallow traces must hold every dense block, the deeper one an expert block more
        raise UsageError(f"n_dense_layers={dense}: a deep stack is planned from traces of {SCALE_POINTS[0]} "
                         f"and {SCALE_POINTS[-1]} blocks per stage, which needs at most {SCALE_POINTS[0]} "
                         f"leading dense blocks; use n_dense_layers <= {SCALE_POINTS[0]}, or n_layer <= "
                         f"{SCALE_POINTS[-1]}")
    if dense and (layers or 0) > dense:
        # DeepSeek's first blocks are dense: the block that stands for the model is an expert block
        with torch.device("meta"):
            workload = spec.build(1, request.seq_len, **{**overrides, "n_dense_layers": 0})
    return workload.model, workload.info.get("config", {}), workload.info.get("seq_len")


def plan(request: ModelRequest, options: TraceOptions, gpu: GPU, gpus: int, cluster: Cluster,
         nodes_of: int | None = None, global_batch: int | None = None, *,
         tensor: Iterable[int] | None = (1,), pipeline: Iterable[int] | None = (1,),
         schedules: Iterable[str] = DEFAULT_SCHEDULES, context: Iterable[int] = (1,),
         expert: Iterable[int] | None = (1,), data: Iterable[str] | None = None,
         checkpoints: Iterable[str | None] | None = None, reshard: Iterable[bool] = (True,)) -> Plan:
    """Rank the layouts of ``request`` on ``gpus`` GPUs of ``gpu``. ``tensor``/``pipeline``/
    ``expert``: the degrees to try (None: every degree the model and nodes allow; the default,
    1, keeps the data-parallel search; ``context``: context-parallel degrees, modelled in
    closed form). ``data``: the data-parallel engines to try (``DATA_KINDS``; a layout without
    data parallelism has none and stays); ``checkpoints``: the checkpointing levels the search
    may use (``CHECKPOINTS``); None: all of them. ``reshard``: FSDP2's reshard after forward,
    True (torchtitan's default without pipelines), False (the gathered parameters kept until
    backward: no backward all-gather, ZeRO-2's traffic), or both.

    The search runs in two passes so that a large cluster is planned in seconds: data and
    tensor parallelism over every degree, then pipeline parallelism at the tensor-parallel
    degree of the best layout of the first pass (the largest degree if none fit), then that
    winner's degree without sequence parallelism."""
    nodes_of = nodes_of or cluster.gpus_per_node
    global_batch = global_batch or gpus * (request.batch or _default_batch(request))
    context = list(context)
    layers = layers_of(request)
    asked = (tensor, pipeline)
    info = _model_info(request, layers)  # one meta build of one block, for the axes and the note
    tensor, pipeline = chunked_loss_axes(options, tensor, pipeline)
    tensor, pipeline = search_axes(request, gpus, nodes_of, layers, tensor, pipeline, info)  # the model's rules first
    check_degrees(gpus, nodes_of, *asked, context, expert)
    expert = expert_degrees(request, gpus, nodes_of, expert, info)
    kinds = set(DATA_KINDS if data is None else data)
    if options.optimizer == "none":  # no optimizer state to shard: ZeRO-1 is DDP
        if data is not None and "zero1" in kinds:
            raise UsageError("--data zero1 shards the optimizer state, and --optimizer none has none: use ddp")
        kinds.discard("zero1")
    levels = tuple(i for i, level in enumerate(CHECKPOINTS) if checkpoints is None or level in set(checkpoints))

    def engines(found: list[Execution]) -> list[Execution]:
        return [e for e in found if e.data_parallel == 1 or e.data in kinds]

    first = engines(layouts(gpus, nodes_of, global_batch, tensor=tensor,
                            pipeline=[1] if 1 in pipeline else pipeline[:1], schedules=schedules, layers=layers,
                            context=context, expert=expert, reshard=reshard))
    results, traces = _in_workers(request, options, gpu, cluster, layers,
                                  [[e for e in first if e.tensor == tp] for tp in tensor], levels=levels)
    deeper = [p for p in pipeline if p > 1 and p not in {e.execution.pipeline for e in results}]
    if deeper:
        fitting = sorted((p for p in results if p.fits), key=lambda p: p.step_s)
        best_tp = fitting[0].execution.tensor if fitting else max(tensor)
        second = engines(layouts(gpus, nodes_of, global_batch, tensor=[best_tp], pipeline=deeper,
                                 schedules=schedules, layers=layers, expert=expert))
        more, more_traces = _in_workers(request, options, gpu, cluster, layers,
                                        [[e for e in second if e.pipeline == pp] for pp in deeper],
                                        fitting[0].step_s if fitting else None, same_work(results), levels)
        results += more
        traces += more_traces
    if not results:
        raise UsageError(
            f"no layout of {request_name(request)} on {gpus} GPUs with tensor degrees {_listed(tensor)}, "
            f"pipeline degrees {_listed(pipeline)}, context degrees {_listed(context)}, expert degrees "
            f"{_listed(expert)} and data parallelism {', '.join(k for k in DATA_KINDS if k in kinds)}: the global batch "
            f"{global_batch} must divide over the data-parallel ranks (GPUs / (tp x pp x cp)), context "
            "parallelism does not combine with pipelines, and stages must split the layers; try other "
            "degrees or --global-batch a multiple of the GPU count"
            + ("" if kinds & {"fsdp", "hsdp"} else " (pipelines and tensor parallelism shard their data-parallel "
                                                 "ranks: FSDP or HSDP, not DDP)"))
    cache = RoleCache()
    slower = [p for p in results if p.time_bound]
    results = [p for p in results if not p.time_bound]
    ranked = sorted((p for p in results if p.fits), key=lambda p: p.step_s)
    if ranked and ranked[0].execution.tensor > 1:  # the winner's degree without sequence parallelism
        plain = replace(ranked[0].execution, sequence_parallel=False)
        results.append(evaluate(request, options, plain, gpu, cluster, layers=layers, cache=cache))
        ranked = sorted((p for p in results if p.fits), key=lambda p: p.step_s)
    rejected = [p for p in results if not p.fits]
    for p in rejected:
        at_least = "at least " if p.memory_bound else ""
        p.reason = f"does not fit: {at_least}{p.memory_bytes / 2**30:.1f} GiB > {capacity(gpu) / 2**30:.1f} GiB"
        if p.memory_bound:
            p.reason += f" ({p.memory_bound}; not traced)"
    if ranked:
        best = ranked[0]
        best.reason = _why(best, ranked[1:])
        for p in ranked[1:]:
            p.reason = f"slower by {p.step_s / best.step_s - 1:.1%}"
        for p in slower:
            p.reason = (f"slower by at least {p.step_s / best.step_s - 1:.1%}: at least {p.step_s * 1e3:.2f} ms "
                        f"({p.time_bound}; not traced further)")
        rejected += slower
    names = {level: name for name, level in CHECKPOINT_NAMES.items()}
    search = {"tensor": list(tensor), "pipeline": list(pipeline), "context": context, "expert": list(expert),
              "schedules": list(schedules), "data": [k for k in DATA_KINDS if k in kinds],
              "checkpoint": [names[CHECKPOINTS[i]] for i in levels],
              "reshard_after_forward": sorted(set(reshard), reverse=True)}
    return Plan(request_name(request), gpu, cluster, gpus, global_batch, ranked, rejected,
                _notes(request, results, layers) + _routing_note(info, options), traces + cache.traces, layers,
                options,
                dict(request.overrides), request.seq_len or (info[2] if info else None), search)


def _notes(request: ModelRequest, results: list[Planned], layers: int | None) -> list[str]:
    notes = []
    if layers and layers > SCALE_POINTS[-1]:
        notes.append(f"the {layers}-block stack is traced with {SCALE_POINTS[0]} and {SCALE_POINTS[1]} blocks "
                     "per stage and extrapolated linearly (exact for state bytes, collectives and FLOPs; "
                     "per phase for memory)")
    if any(p.execution.pipeline > 1 for p in results) and request_name(request).startswith("gpt2"):
        notes.append("tied embeddings under pipeline parallelism: their gradient all-reduce between the "
                     "first and last stage is not traced")
    if any(p.execution.tensor > 1 and p.execution.pipeline > 1 for p in results):
        notes.append("tensor x pipeline layouts gather the logits for the loss (no loss parallelism on the "
                     "last stage)")
    if any(p.execution.data == "zero1" for p in results):
        deep = layers and layers > SCALE_POINTS[-1]
        notes.append("ZeRO-1 is PyTorch's ZeroRedundancyOptimizer: whole parameters handed out per rank, the "
                     "busiest rank's figures shown" + (" (the deep stack's busiest estimated from the shallow "
                     "traces: the larger of the largest parameter and the average share)" if deep else "")
                     + "; DeepSpeed's stage 1 and Megatron-LM's distributed optimizer split a flat buffer evenly "
                     "and reduce-scatter and all-gather it: less state on the busiest rank, less traffic")
    return notes


def _routing_note(info: tuple[Any, dict[str, Any], int | None] | None, options: TraceOptions) -> list[str]:
    """A mixture-of-experts model's routing is an assumption of every traced rank: say which."""
    from nnperf.trace.parallel.expert import has_experts
    from nnperf.trace.routing import Routing

    experts = has_experts(info[0]) if info is not None else 0
    if not experts:
        return []
    routing = Routing(options.moe_load, options.moe_capacity_factor)
    return [routing.describe(experts, info[1].get("top_k", 1)) + "; under expert parallelism every rank routes "
            "as the traced one (rank 0, holding the busiest experts)"]


#: Processes a plan's searches run in (default: 2 where a fork is safe, else 1).
WORKERS_ENV = "NNPERF_PLAN_WORKERS"
_TASKS: list[Any] = []  # what a forked worker runs (inherited, nothing pickled)


def _in_workers(request: ModelRequest, options: TraceOptions, gpu: GPU, cluster: Cluster, layers: int | None,
                groups: list[list[Execution]], slower_than: float | None = None,
                work: dict[tuple[Any, ...], list[Planned]] | None = None,
                levels: tuple[int, ...] = tuple(range(len(CHECKPOINTS)))) -> tuple[list[Planned], int]:
    """``_search`` of each group of candidates (they share no traced role), in forked worker
    processes where that is safe: each worker has its own traced roles; the results and the
    number of traces come back."""
    import multiprocessing
    import os
    import sys

    from nnperf.search.fit_parallel import fork_is_safe, one_thread

    groups = [g for g in groups if g]
    wanted = os.environ.get(WORKERS_ENV)
    workers = int(wanted) if wanted and wanted.isdigit() else min(2, os.cpu_count() or 1)
    workers = min(workers, len(groups))
    _TASKS[:] = [(request, options, gpu, cluster, layers, g, slower_than, work, levels) for g in groups]
    if workers <= 1 or not sys.platform.startswith("linux") or not fork_is_safe():
        outputs = [_run_task(i) for i in range(len(groups))]
    else:
        with multiprocessing.get_context("fork").Pool(workers, initializer=one_thread) as pool:
            outputs = pool.map(_run_task, range(len(groups)), chunksize=1)
            # the workers exit on their own: the pool's terminate() (on leaving ``with``) sends
            # SIGTERM, which a worker blocked on the task queue's lock can miss (the CLI's
            # SIGTERM handler runs in Python, and the lock wait does not return), hanging the plan
            pool.close()
            pool.join()
    results = [p for planned, _ in outputs for p in planned]
    return results, sum(t for _, t in outputs)


def _run_task(index: int) -> tuple[list[Planned], int]:
    request, options, gpu, cluster, layers, group, slower_than, work, levels = _TASKS[index]
    cache = RoleCache()
    return _search(request, options, group, gpu, cluster, layers, cache, slower_than, work, levels), cache.traces


def _search(request: ModelRequest, options: TraceOptions, candidates: list[Execution], gpu: GPU,
            cluster: Cluster, layers: int | None, cache: RoleCache, slower_than: float | None = None,
            work: dict[tuple[Any, ...], list[Planned]] | None = None,
            allowed: tuple[int, ...] = tuple(range(len(CHECKPOINTS)))) -> list[Planned]:
    """Per group (one ``shape_key``), the largest micro-batch that fits, found by bisection
    (memory only grows with the micro-batch), without checkpointing and then with each
    checkpointing level in turn while it lets a larger micro-batch fit: recomputation only
    pays for itself through the larger micro-batch it makes room for, so a level is tried
    only where the one before it could not fit the whole local batch at once, and only for
    micro-batches larger than the one that level fitted. Which of them is fastest the ranking
    decides.

    Data-parallel kinds dominate one another in memory: HSDP, ZeRO-1 and DDP hold at least FSDP's
    per-GPU state with the same activations, so they are searched only where FSDP fits, at
    FSDP's checkpointing levels and micro-batches or smaller; a layout they cannot fit is not
    traced, nor one whose model states alone cannot fit (``search.plan_states``, from FSDP's
    trace). ``slower_than``: the fastest step found so far, below which a pipeline's first stage
    must keep it to be traced to the end (``search.plan_pipeline``), and its GPUs' work (``work``,
    ``same_work``) to be traced at all. ``allowed``: the indices of ``CHECKPOINTS`` the search
    may use, in that order."""
    groups: dict[tuple[Any, ...], list[Execution]] = {}
    for execution in candidates:
        groups.setdefault(shape_key(execution), []).append(execution)
    order = sorted(groups, key=lambda k: k[0] != "fsdp")  # FSDP first: it bounds the others
    fsdp_fits: dict[tuple[Any, ...], dict[int, Planned]] = {}  # rest of the key -> fit per checkpoint level
    results: list[Planned] = []
    for key in order:
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
            first = [replace(e, checkpoint=CHECKPOINTS[levels[0]]) for e in members
                     if e.micro_batch <= largest[levels[0]]]
            bound = states_bound(sibling, sibling.execution.shard, first[0], options.optimizer) if first else None
            if bound is not None and bound > capacity(gpu):
                results.append(Planned(first[0], memory_bytes=bound, memory_bound=STATES_BOUND,
                                       rank=None if first[0].data == "zero1" else 0))  # ZeRO-1's: an average
                continue
        above = 0  # micro-batches at or below this one are not worth recomputing for
        for level in levels:
            tried = [replace(e, checkpoint=CHECKPOINTS[level]) for e in members
                     if above < e.micro_batch <= largest.get(level, e.micro_batch)]
            if not tried:
                continue
            fit = _first_fit(tried, request, options, gpu, cluster, layers, cache, results, slower_than, work)
            if fit is None:
                continue
            if key[0] == "fsdp":
                fsdp_fits.setdefault(rest, {})[level] = fit
            above = fit.execution.micro_batch
            if above == members[0].micro_batch:
                break  # the whole local batch at once: more recomputation only slows it down
    return results


def _first_fit(members: list[Execution], request: ModelRequest, options: TraceOptions, gpu: GPU,
               cluster: Cluster, layers: int | None, cache: RoleCache, results: list[Planned],
               slower_than: float | None = None, work: dict[tuple[Any, ...], list[Planned]] | None = None) -> Planned | None:
    """The first of ``members`` (largest micro-batch first) that fits, by bisection; the layouts
    that do not fit and the one found are added to ``results`` (a fitting one with more
    accumulation than needed is only slower)."""
    low, high, best = 0, len(members) - 1, None
    while low <= high:
        mid = (low + high) // 2
        planned = (work and work_bound(members[mid], work, slower_than, capacity(gpu), layers)) or evaluate(
            request, options, members[mid], gpu, cluster, layers=layers, cache=cache, prune=True,
            slower_than=slower_than)
        if planned.fits:
            best, high = planned, mid - 1
        else:
            results.append(planned)
            low = mid + 1
    if best is not None:
        results.append(best)
    return best


def _work_key(execution: Execution) -> tuple[Any, ...]:
    """What decides the kernels a GPU runs over a step, whatever the data and pipeline layout:
    the tensor split, the checkpointing and the micro-batch (``same_work``)."""
    e = execution
    return e.tensor, e.sequence_parallel, e.context, e.expert, e.checkpoint, e.micro_batch


def same_work(results: Iterable[Planned]) -> dict[tuple[Any, ...], list[Planned]]:
    """The traced layouts without a pipeline, by the work their GPUs do (``_work_key``).

    A pipeline of ``p`` stages over the same GPUs, tensor split, checkpointing and micro-batch
    does the same kernels per GPU on average: each rank runs ``1/p`` of the blocks for ``p``
    times the samples (its data-parallel group is ``p`` times smaller), the embedding and the
    head run on one rank in ``p`` for ``p`` times the samples, and FSDP's shards (of ``1/p`` of
    the parameters over ``1/p`` of the ranks) give each GPU the same optimizer step. Its step
    is at least its busiest rank's compute, so at least that average: the layout's compute
    without what overlapping collectives slowed (which the layouts' communication decides)."""
    out: dict[tuple[Any, ...], list[Planned]] = {}
    for p in results:
        if p.execution.pipeline > 1 or p.time_bound or p.memory_bound or not p.split:
            continue
        out.setdefault(_work_key(p.execution), []).append(p)
    return out


def work_bound(execution: Execution, work: dict[tuple[Any, ...], list[Planned]], slower_than: float | None,
               capacity_bytes: float | None = None, layers: int | None = None) -> Planned | None:
    """``execution`` (a pipeline) left untraced at a bound that a traced layout doing the same
    work per GPU gives (``same_work``), or None where neither bound rules it out:

    - memory, where it exceeds ``capacity_bytes``: rank 0 holds its blocks' parameters and
      optimizer state (``layers / p`` blocks sharded over its shard group, each block's bytes
      those of an FSDP layout's shard times its shard group) and the saved activations of the
      blocks its schedule keeps in flight (``blocks_in_flight``), each block's as in that FSDP
      layout (the same micro-batch, tensor split and checkpointing; the pipelines are FSDP's
      too: DDP's blocks save autocast's weight casts besides, 419 against 337 KB a block of a
      small Llama); everything else it holds only adds;
    - time, where it is no faster than ``slower_than``: the least compute of those layouts."""
    same = work.get(_work_key(execution), []) if execution.pipeline > 1 else []
    sharded = next((p for p in same if p.execution.data == "fsdp" and "saved_activations" in p.per_block), None)
    if capacity_bytes is not None and layers and sharded is not None and not execution.replicates_parameters:
        from nnperf.search.plan_pipeline import blocks_in_flight

        block = sharded.per_block
        # the layout's per-GPU bytes of a block, times its shard group, are the block's (per
        # tensor-parallel rank); rank 0 holds layers / p of them over its own shard group
        whole = (block.get("state.parameters", 0.0) + block.get("state.optimizer_state", 0.0)) * _shards(sharded.execution)
        states = layers / execution.pipeline * whole / _shards(execution)
        held = states + blocks_in_flight(execution, layers) * block["saved_activations"]
        if held > capacity_bytes:
            return Planned(execution, memory_bytes=int(held),
                           memory_bound="its blocks' parameters, optimizer state and in-flight saved activations "
                                        f"alone, each block's as in {sharded.execution.describe()}")
    if slower_than is None or not same:
        return None
    least = min(same, key=_compute_alone)
    if _compute_alone(least) < slower_than:
        return None
    return Planned(execution, step_s=_compute_alone(least), fits=True, memory_bound="not traced",
                   time_bound=f"its GPUs' compute: the same kernels per GPU as {least.execution.describe()}")


def _shards(execution: Execution) -> int:
    """The ranks a layout shards its parameters and optimizer state over (DDP: none; only
    pipelines ask, and ZeRO-1 runs none)."""
    return 1 if execution.replicates_parameters else execution.shard


def _compute_alone(planned: Planned) -> float:
    return planned.split["compute_s"] - planned.split.get("overlap_slowdown_s", 0.0)


#: The share of the step the host's issuing takes from which a layout is called host-bound (the
#: device idles between the host's launches).
HOST_BOUND = 0.9


def _why(best: Planned, others: list[Planned]) -> str:
    exposed = sum(best.split["exposed_communication_s"].values())
    text = f"fastest: {best.split['compute_s'] / best.step_s:.0%} of the step is compute, " \
           f"{exposed / best.step_s:.0%} exposed communication"
    bubble = best.split.get("pipeline_bubble_s")
    if bubble:
        text += f", {bubble / best.step_s:.0%} pipeline bubble"
    host = best.split.get("host_s", 0.0)
    if host >= HOST_BOUND * best.step_s:
        text += f"; host-bound: issuing the ops takes the host {host / best.step_s:.0%} of the step"
    if others:
        text += f"; next best {others[0].execution.describe()} is {others[0].step_s / best.step_s - 1:.1%} slower"
    return text


def smallest_memory(plan_: Plan) -> str:
    """Nothing fits: the smallest per-GPU memory any layout reached and what would make it fit."""
    least = min((p for p in plan_.rejected if not p.time_bound), key=lambda p: p.memory_bytes)
    need = least.memory_bytes / capacity(plan_.gpu)
    at_least = "at least " if least.memory_bound else ""
    return (f"no layout of {plan_.model} fits on {plan_.gpus} x {plan_.gpu.name}: the smallest is "
            f"{at_least}{least.memory_bytes / 2**30:.1f} GiB per GPU ({least.execution.describe()}) against "
            f"{capacity(plan_.gpu) / 2**30:.1f} GiB; it needs {at_least}{need:.1f}x the memory: "
            + ", ".join(_remedies(plan_.options, least.execution, least.loss_saved_bytes)))


#: Below this, what an eager loss keeps is not worth naming as a remedy.
_LOSS_REMEDY_BYTES = 2**30


def _remedies(options: TraceOptions, smallest: Execution, loss_saved: int = 0) -> list[str]:
    """What could still shrink the smallest layout: only what the plan did not already use."""
    out = ["more GPUs to shard over"]
    if options.loss == "eager" and loss_saved >= _LOSS_REMEDY_BYTES:
        out.append(f"a compiled or chunked loss (--loss compiled: torchtitan's [compile] components = [\"loss\"]; "
                   f"--loss chunked: its ChunkedLossWrapper): the eager cross entropy keeps "
                   f"{loss_saved / 2**30:.1f} GiB of copies of the logits for backward")
    if smallest.micro_batch > 1:
        out.append("a smaller micro-batch")
    if options.amp is None and options.dtype in (None, "fp32", "fp64"):
        out.append("bf16 (--amp bf16)")
    if options.train and options.optimizer in ("adamw", "adam"):
        out.append(f"an optimizer with less state than {options.optimizer} (two fp32 moments per "
                   "parameter; --optimizer sgd keeps none)")
    if smallest.model_parallel == 1:
        out.append("tensor/pipeline parallelism")
    return out
