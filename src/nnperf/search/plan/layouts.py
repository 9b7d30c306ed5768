"""The candidate layouts of a plan: every (tensor, pipeline, context, expert) degree with data
parallelism over the rest of the GPUs, each data-parallel engine that can run it, and every
split of the global batch into micro-batches. Grouped by ``shape_key``: within a group only the
micro-batch and checkpointing differ, and the search bisects over the micro-batch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from nnperf.errors import UsageError
from nnperf.layout import (
    DATA_ENGINES,
    DEFAULT_SCHEDULES,
    INTERLEAVE,
    SCHEDULES,
    Execution,
    split_layers,
)
from nnperf.search.accumulation import local_batch, micro_batches


@dataclass(frozen=True)
class PipelineSplitChoice:
    """How the searched pipelines split the layers: the chunks per rank the multi-chunk
    schedules try (``--vpp``), and an uneven first and last stage (``--first-stage-layers``,
    ``--last-stage-layers``; None: as the other stages)."""

    virtual: tuple[int, ...] = (INTERLEAVE,)
    first: int | None = None
    last: int | None = None
    #: ``virtual`` was asked for (``--vpp`` given, even at its default): each count must then
    #: split every searched pipeline's stages, or the plan says why in one line
    virtual_asked: bool = False

    def holds(self, layers: int, pipeline: int, virtual: int = 1) -> bool:
        try:
            split_layers(layers, pipeline, virtual, self.first, self.last)
        except UsageError:
            return False
        return True

    def chunks_per_rank(self, schedules: Iterable[str]) -> list[int]:
        """The chunks per rank the given schedules run: 1 for a one-chunk schedule, each of
        ``virtual`` for a multi-chunk one."""
        counts = {v for s in schedules for v in (self.virtual if SCHEDULES[s].multi_chunk else (1,))}
        return sorted(counts)

    def holds_any(self, layers: int, pipeline: int, schedules: Iterable[str]) -> bool:
        """Some schedule of ``schedules`` can split ``layers`` over ``pipeline`` stages (an
        interleaved one needs each of its chunks alike between the end stages, and at least
        one block in each chunk of those)."""
        return any(self.holds(layers, pipeline, v) for v in self.chunks_per_rank(schedules))

    def check(self, layers: int, pipeline: int, schedules: Iterable[str], gpus: int | None = None,
              where: str | None = None) -> None:
        """One line naming the valid splits where no schedule of ``schedules`` can hold the
        layers over ``pipeline`` stages (the one-chunk schedule's line where one was asked for;
        the pipeline degrees it names divide ``gpus``, described by ``where``: ``split_layers``)."""
        if not self.holds_any(layers, pipeline, schedules):
            split_layers(layers, pipeline, (self.chunks_per_rank(schedules) or [1])[0], self.first, self.last,
                         gpus=gpus, where=where)


def _nearest_gpu_counts(gpus: int, global_batch: int) -> str:
    valid = sorted({d for d in range(1, gpus * 2 + 1) if global_batch % d == 0}, key=lambda d: abs(d - gpus))[:2]
    return ", ".join(map(str, sorted(valid)))


def fills_nodes(tp: int, nodes_of: int) -> bool:
    """A tensor-parallel group fills nodes evenly: it divides a node's GPUs, or is whole nodes of
    them (the SC21 paper's 16- and 32-way groups over 8-GPU nodes, asked for: its collectives
    then cross the network)."""
    return nodes_of % tp == 0 or tp % nodes_of == 0


def layouts(gpus: int, nodes_of: int, global_batch: int, *, tensor: Iterable[int] = (1,),
            pipeline: Iterable[int] = (1,), schedules: Iterable[str] = DEFAULT_SCHEDULES,
            layers: int | None = None, checkpoints: Iterable[str | None] = (None,),
            context: Iterable[int] = (1,), expert: Iterable[int] = (1,),
            reshard: Iterable[bool] = (True,), split: PipelineSplitChoice | None = None,
            expert_tensor: int | None = None) -> list[Execution]:
    """Every layout of ``gpus`` GPUs over the given tensor and pipeline degrees (sequence
    parallel with TP), data parallelism over the rest, and the micro-batch splits of the global
    batch; with the defaults, the data-parallel layouts only. Grouped: within a group (one
    ``shape_key``) the micro-batch shrinks, so the first that fits is the group's best. An
    expert-parallel degree above 1 takes the FSDP/HSDP layouts whose shard group it divides,
    without tensor parallelism, and the DDP/ZeRO-1 layouts whose data-parallel ranks it divides;
    neither with context parallelism (``Execution._validate_expert``). ``reshard``: whether
    FSDP/HSDP frees a block's gathered parameters after its forward (FSDP2's
    ``reshard_after_forward``; pipelines keep them, as torchtitan's). ``split``: the virtual
    stages of the multi-chunk schedules and an uneven first and last stage (default: 2 chunks
    per rank, even stages); a schedule whose split cannot hold the layers is left out.
    ``expert_tensor``: Megatron-LM's expert tensor parallelism of the layouts with expert and
    tensor parallelism (``Execution.expert_tensor``; 1: only degrees that fold over the tensor
    ranks are laid out)."""
    split = split or PipelineSplitChoice()
    out: list[Execution] = []
    expert = list(expert)
    tensor, pipeline, context = list(tensor), list(pipeline), list(context)
    # data parallelism alone is the only candidate: a global batch it cannot split is one line
    alone = tensor == pipeline == context == [1]
    for tp in tensor:
        for pp in pipeline:
            for cp in context:
                found = _layouts_of(gpus, nodes_of, global_batch, tp, pp, cp, schedules, layers, checkpoints,
                                    tuple(reshard), split, refuse=alone)
                if 1 in expert:  # the degrees asked for only, as every other axis
                    out += found
                out += [_with_experts(e, ep, expert_tensor) for ep in expert if ep > 1 for e in found
                        if _carries(e, ep, expert_tensor)]
    return out


def check_micro_batches(sizes: set[int], found: list[Execution]) -> list[str]:
    """``--micro-batch`` against the layouts of the asked degrees (``found``, before the sizes
    filter them): none of the sizes in any layout is one line naming the sizes they run;
    (tensor, pipeline) degrees that lose every layout to the sizes are said in a note."""
    if not found:
        return []  # what fails is the search's to say (the global batch, the stages)
    asked = ",".join(map(str, sorted(sizes)))
    offered = sorted({e.micro_batch for e in found})
    if not sizes & set(offered):
        raise UsageError(f"--micro-batch {asked}: no layout of these degrees runs it (a micro-batch divides a "
                         f"data-parallel rank's share of the global batch; a pipeline runs at least one "
                         f"micro-batch a stage, interleaved a multiple of the stages); sizes they run: "
                         f"{', '.join(map(str, offered))}")
    shapes = sorted({(e.tensor, e.pipeline) for e in found})
    lost = [shape for shape in shapes if not any(e.micro_batch in sizes for e in found
                                                 if (e.tensor, e.pipeline) == shape)]
    return [f"--micro-batch {asked}: no layout of tensor x pipeline {', '.join(f'{t} x {p}' for t, p in lost)} "
            "runs it, so none is ranked"] if lost else []


def check_expert_degrees(gpus: int, nodes_of: int, global_batch: int, *, tensor: Iterable[int],
                         pipeline: Iterable[int], context: Iterable[int], expert: Iterable[int],
                         kinds: set[str], expert_count: int, layers: int | None = None,
                         schedules: Iterable[str] = DEFAULT_SCHEDULES,
                         split: PipelineSplitChoice | None = None, expert_tensor: int | None = None) -> None:
    """Expert degrees (all above 1: ``--ep``) that no layout of the other degrees and the
    data-parallel ``kinds`` can carry are one line, before any trace: the groups an expert
    degree must divide (``layouts``' rule) and the degrees that divide them and the model's
    ``expert_count`` experts. Layouts that fail for another reason (the global batch, the
    stages) are left to the search's own message."""
    expert, tensor, context = list(expert), list(tensor), list(context)
    if not expert or 1 in expert:
        return
    found = [e for tp in tensor for pp in pipeline for cp in context
             for e in _layouts_of(gpus, nodes_of, global_batch, tp, pp, cp, schedules, layers, (None,), (True,), split)
             if e.data_parallel == 1 or e.data in kinds]
    carried = [e for e in found if _carries(e, 1)]
    asked = ",".join(map(str, expert))
    if not carried:
        if found and not (1 in tensor and 1 in context):  # else what fails is the search's to say
            raise UsageError(f"--ep {asked}: expert parallelism is planned without context parallelism, and with "
                             "tensor parallelism only beside ddp or zero1 (Megatron-LM's); ask --cp 1, and --tp 1 "
                             "with fsdp or hsdp")
        return
    if any(_carries(e, ep, expert_tensor) for e in carried for ep in expert):
        return
    groups = sorted({e.replicate if e.replicates_parameters else e.shard for e in carried})
    valid = sorted({d for g in groups for d in range(2, g + 1) if g % d == 0 and expert_count % d == 0})
    if expert_tensor == 1 and min(tensor) > 1:  # folded: a multiple of the tensor degree
        valid = sorted({ep for e in carried for ep in range(2, expert_count + 1)
                        if expert_count % ep == 0 and _carries(e, ep, 1)})
        raise UsageError(f"--ep {asked} with --etp 1 folds the expert group over the tensor-parallel ranks: a "
                         "degree must be a multiple of the tensor degree whose quotient divides the data-parallel "
                         f"ranks; valid: {', '.join(map(str, valid)) or 'none'}")
    raise UsageError(f"--ep {asked} divides none of the groups the experts can spread over, the data-parallel "
                     f"ranks (ddp, zero1) or the shard group (fsdp, hsdp): {', '.join(map(str, groups))} here; valid: "
                     + (", ".join(map(str, valid)) if valid else "none above 1 (ask fewer tensor, pipeline or "
                        "context ranks)"))


def _carries(execution: Execution, expert: int, expert_tensor: int | None = None) -> bool:
    """Whether ``execution`` can carry expert parallelism ``expert`` (1: some degree): no
    context parallelism, tensor parallelism only beside DDP or ZeRO-1 (Megatron-LM's expert
    tensor parallelism), the degree dividing the group the experts are carved out of, or
    beside tensor parallelism a multiple of its degree that folds over it
    (``Execution.folds_experts``; only that with ``expert_tensor`` 1)."""
    if execution.context > 1 or not execution.carries_split_experts:
        return False
    if expert_tensor == 1 and execution.tensor > 1 and expert > 1:
        return _with_experts(execution, expert, expert_tensor).folds_experts
    group = execution.replicate if execution.replicates_parameters else execution.shard
    return group % expert == 0 or replace(execution, expert=expert).folds_experts


def _with_experts(execution: Execution, expert: int, expert_tensor: int | None) -> Execution:
    """``execution`` with expert parallelism ``expert``, its experts split as ``expert_tensor``
    asks where tensor parallelism is beside them."""
    split = expert_tensor if execution.tensor > 1 and execution.replicates_parameters else None
    return replace(execution, expert=expert, expert_tensor=split)


def _layouts_of(gpus: int, nodes_of: int, global_batch: int, tp: int, pp: int, cp: int,
                schedules: Iterable[str], layers: int | None, checkpoints: Iterable[str | None],
                reshard: tuple[bool, ...] = (True,), split: PipelineSplitChoice | None = None,
                refuse: bool = False) -> list[Execution]:
    """The layouts of one (tensor, pipeline, context) degree: data parallelism over the rest
    (``refuse``: a global batch the data-parallel ranks cannot split is one line, not none)."""
    if gpus % (tp * pp * cp) or not fills_nodes(tp, nodes_of):
        return []
    dp = gpus // (tp * pp * cp)
    if global_batch % dp:
        if refuse:
            try:
                local_batch(global_batch, gpus)
            except UsageError as err:
                raise UsageError(f"{err}; or GPU counts that divide it: "
                                 f"{_nearest_gpu_counts(gpus, global_batch)}") from None
        return []
    out: list[Execution] = []
    for data, shard in _data_shapes(dp, tp * cp, pp, nodes_of):
        for checkpoint in checkpoints:
            common = {"world": gpus, "data": data, "shard": shard, "gpus_per_node": nodes_of,
                      "checkpoint": checkpoint, "tensor": tp, "sequence_parallel": tp > 1, "context": cp}
            shards = not DATA_ENGINES[data].replicates_parameters
            for keep in sorted({not r for r in reshard} if shards and pp == 1 else {False}):
                out.extend(_splits(common | ({"reshard_after_forward": False} if keep else {}), pp,
                                   global_batch // dp, schedules, layers, split or PipelineSplitChoice()))
    return out


def _data_shapes(dp: int, tp: int, pp: int, nodes_of: int) -> list[tuple[str, int]]:
    if dp == 1:
        return [("ddp", 1)]  # no data parallelism
    shapes = [("ddp", 1), ("zero1", 1)]  # Megatron-LM's data parallelism beside any tensor x pipeline
    shapes.append(("fsdp", dp))
    inside = max(1, nodes_of // tp)  # HSDP: shard inside a node, replicate across
    if 1 < inside < dp and dp % inside == 0:
        shapes.append(("hsdp", inside))
    return shapes


def _splits(common: dict[str, Any], pp: int, local: int, schedules: Iterable[str],
            layers: int | None, split: PipelineSplitChoice) -> list[Execution]:
    if pp == 1:  # every accumulation of the local batch, fewest steps last: ascending micro-batches reversed
        return [Execution(**common, micro_batch=m, grad_accum=local // m) for m in reversed(micro_batches(local))]
    out = []
    for schedule in schedules:
        data_parallel = common["world"] // (common["tensor"] * pp * common["context"])
        if not _runs_beside(schedule, common["data"], data_parallel):
            continue
        for virtual in split.virtual if SCHEDULES[schedule].multi_chunk else (1,):
            if layers is not None and not split.holds(layers, pp, virtual):
                continue
            for micro in _micro_batch_counts(schedule, pp, local, DATA_ENGINES[common["data"]].replicates_parameters):
                out.append(Execution(**common, pipeline=pp, pipeline_schedule=schedule, virtual_stages=virtual,
                                     micro_batch=local // micro, grad_accum=micro,
                                     reshard_after_forward=False,  # torchtitan: no reshard under PP
                                     first_stage_layers=split.first, last_stage_layers=split.last))
    return out


def _fixed_ranks(gpus: int, tensor: list[int], pipeline: list[int], context: list[int]) -> int | None:
    """The data-parallel ranks of the one layout fixed degrees leave; None where a degree is
    searched or they do not divide the GPUs."""
    if len(tensor) != 1 or len(pipeline) != 1 or len(context) != 1:
        return None
    model_parallel = tensor[0] * pipeline[0] * context[0]
    return None if gpus % model_parallel else gpus // model_parallel


def _nearest_multiples(value: int, unit: int) -> str:
    """The multiples of ``unit`` either side of ``value`` (above zero): "16 or 24"."""
    below = value // unit * unit
    return " or ".join(str(b) for b in (below, below + unit) if b > 0)


def why_no_layout(gpus: int, nodes_of: int, global_batch: int, tensor: list[int], pipeline: list[int],
                  context: list[int], schedules: Iterable[str], kinds: set[str],
                  sizes: set[int] | None = None) -> str | None:
    """Why one (tensor, pipeline, context) degree, all three fixed, leaves no layout, in words
    naming the global batches that would have one; None where the degrees are searched or the
    reason is another's to say (the layers' split, the expert degree)."""
    dp = _fixed_ranks(gpus, tensor, pipeline, context)
    if dp is None or not fills_nodes(tensor[0], nodes_of):
        return None  # searched degrees, or check_degrees says so first
    pp = pipeline[0]
    schedules = list(schedules)
    megatron = dp == 1 or any(DATA_ENGINES[k].replicates_parameters for k in kinds)
    micro = min(sizes) if sizes and len(sizes) == 1 else 1
    if global_batch % (dp * micro):
        degrees = " x ".join(f"{name} {d}" for name, d in (("tp", tensor[0]), ("pp", pp), ("cp", context[0]))
                             if d > 1 or name == "tp")
        over = f"the {dp} data-parallel rank{'' if dp == 1 else 's'} ({gpus} GPUs / ({degrees}))"
        if micro > 1:
            over += f" in micro-batches of {micro}"
        nearest = _nearest_runnable(global_batch, dp, pp, micro, schedules, kinds)
        return (f"the global batch {global_batch} does not divide over {over}"
                + (f"; try --global-batch {nearest}" if nearest else ""))
    if pp == 1:
        return None  # not the pipeline: another's to say
    local = global_batch // dp
    if _runnable_counts(pp, local, dp, schedules, kinds):
        return None
    per_stage = [s for s in schedules if not SCHEDULES[s].multi_chunk and s != "gpipe"]
    rule = ("a multiple of the stages (interleaved)" if not per_stage else
            "at least one a stage (1F1B)" if len(per_stage) == len(list(schedules)) else
            "at least one a stage (1F1B), a multiple of them (interleaved)")
    nearest = _nearest_multiples(global_batch, dp * pp)
    samples = f"{local} sample{'' if local == 1 else 's'}"
    return (f"a data-parallel rank's {samples} of the global batch {global_batch} ({dp} data-parallel ranks) "
            f"make too few micro-batches for {pp} pipeline stages: the schedules run {rule}; "
            f"try --global-batch {nearest} (a multiple of {dp} ranks x {pp} stages)"
            + ("" if megatron or "1f1b" not in schedules else ", or --data ddp or zero1 (Megatron-LM's 1F1B runs fewer)"))


def _nearest_runnable(global_batch: int, dp: int, pp: int, micro: int, schedules: list[str],
                      kinds: set[str]) -> str | None:
    """The global batches either side of ``global_batch`` that ``dp`` data-parallel ranks of one
    of ``kinds`` run in micro-batches of ``micro`` with some schedule of ``schedules`` over ``pp``
    stages, as ``_splits`` builds layouts (zero-bubble not beside DDP's reducer, Megatron-LM's
    short 1F1B beside its data parallelism): "4 or 8"; None where none of them runs any. Within
    ``pp`` multiples of the unit above: a rank's ``pp`` micro-batches run on every schedule."""
    unit = dp * micro

    def runs(batch: int) -> bool:
        if pp == 1:  # no pipeline: any accumulation of the rank's samples
            return True
        local = batch // dp
        return local // micro in _runnable_counts(pp, local, dp, schedules, kinds)

    start = global_batch // unit * unit
    below = next((b for b in range(start, 0, -unit) if runs(b)), None)
    above = next((b for b in range(start + unit, start + unit * (pp + 1) + 1, unit) if runs(b)), None)
    found = [str(b) for b in (below, above) if b is not None]
    return " or ".join(found) or None


def _runnable_counts(pp: int, local: int, dp: int, schedules: list[str], kinds: set[str]) -> set[int]:
    """The micro-batch counts some schedule of ``schedules`` runs a rank's ``local`` samples in
    over ``pp`` stages beside ``dp`` data-parallel ranks of one of ``kinds``, as ``_splits``
    builds layouts (zero-bubble not beside DDP's reducer; Megatron-LM's short 1F1B beside its
    data parallelism, or without any)."""
    return {count for kind in kinds for schedule in schedules if _runs_beside(schedule, kind, dp)
            for count in _micro_batch_counts(schedule, pp, local, DATA_ENGINES[kind].replicates_parameters or dp == 1)}


def _runs_beside(schedule: str, data: str, data_parallel: int) -> bool:
    """Whether a pipeline schedule runs beside ``data_parallel`` ranks of the engine ``data``:
    zero-bubble not beside DDP's reducer (``Execution.validate``)."""
    return not (schedule == "zero-bubble" and DATA_ENGINES[data].replicates_parameters and data_parallel > 1)


def _micro_batch_counts(schedule: str, pp: int, local: int, megatron: bool = False) -> list[int]:
    """The micro-batch counts a schedule runs a rank's ``local`` samples in (each count divides
    them): GPipe any; 1F1B at least one a stage (its warm-up fills the pipeline), as Megatron-LM's
    and DeepSpeed's 1F1B run any such count (BLOOM: 128 micro-batches on 12 stages); the
    multi-chunk schedules a multiple of the stages, the rule of Megatron-LM's interleaved schedule
    (each round through a rank's chunks is one micro-batch of each stage), kept for zero-bubble
    too: a narrowing, as torch's interleaved schedules also run some other counts. ``megatron``:
    Megatron-LM's 1F1B beside its data parallelism (``Execution.runs_short_1f1b``) also runs
    fewer than a stage each, searched where a rank's samples make no more (a pipeline that short
    is mostly bubble: never the faster choice where more micro-batches can be had)."""
    if schedule == "gpipe":
        first, step = 1, 1
    elif SCHEDULES[schedule].multi_chunk:
        first, step = pp, pp
    else:
        first, step = (1 if megatron and local < pp else pp), 1
    return [m for m in range(first, local + 1, step) if local % m == 0]


def shape_key(execution: Execution) -> tuple[Any, ...]:
    """What a group of layouts shares: all but the micro-batch split and checkpointing."""
    e = execution
    return (e.data, e.shard, e.tensor, e.sequence_parallel, e.pipeline, e.pipeline_schedule, e.virtual_stages,
            e.first_stage_layers, e.last_stage_layers,
            e.context, e.expert, e.reshard_after_forward)
