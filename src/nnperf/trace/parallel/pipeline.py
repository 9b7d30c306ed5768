"""Pipeline parallelism with PyTorch's own ``torch.distributed.pipelining``, one rank at a time.

The model's repeated blocks are split into ``pipeline x virtual`` contiguous chunks (torchtitan's
manual split, ``pipeline_module_split``): the first chunk also holds the embeddings, the last
the final norm, the output projection and the loss. Rank ``r`` holds chunks ``r, r + p, ...``
(the "loop" placement the interleaved and looped schedules use; GPipe and 1F1B: one chunk).
Each chunk becomes a real ``PipelineStage`` on the pipeline process group and the rank runs the
real schedule (``ScheduleGPipe``, ``Schedule1F1B``, ``ScheduleInterleaved1F1B``,
``ScheduleInterleavedZeroBubble``) over its micro-batches: its forward and backward chunks, the
loss, the point-to-point sends and receives, the gradient scaling and what stays alive between a
micro-batch's forward and its backward are the engine's. The recorder is told where each of the
schedule's actions starts (``F``/``B``/``I``/``W``, stage, micro-batch), so per-action times
come from the trace; ``pipeline_order`` (the schedule's own plan of every rank) gives the order
the step-time simulation (``passes.pipeline_timeline``) replays.

Stage shapes are given to ``PipelineStage`` (its own shape inference exchanges metadata with the
neighbours, which a fake process group cannot answer): one micro-batch runs through the chunks
up to the rank's last one under ``no_grad`` before the step, unrecorded, without their blocks
(a block keeps its input's shape: each traced forward checks it), so tensor and expert
parallelism apply to the rank's own blocks only (``held_blocks_only``). Tied input/output
embeddings (GPT-2) become one copy on the first and one on the last stage, as in Megatron-LM;
their gradient all-reduce between the two stages is not traced (listed in the plan's notes).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from nnperf.errors import UsageError
from nnperf.layout import MULTI, Execution
from nnperf.trace.diagnosis import quiet_fsdp_view_warning
from nnperf.trace.options import TraceOptions
from nnperf.trace.recorder import unrecorded
from nnperf.workload import Workload, default_loss


@dataclass(frozen=True)
class PipelineSplit:
    """How a model splits into pipeline chunks, declared with the model (its
    ``pipeline_split()``): the modules before the blocks (``pre``), the blocks' list, the
    modules after (``post``: the final ``norm`` and the output ``projection``), and the first
    chunk's forward up to its blocks. ``chunkable``: a chunked loss may take the projection over
    (torchtitan's ChunkedLossWrapper; the models whose whole forward offers it too)."""

    pre: tuple[str, ...]
    blocks: str
    norm: str
    projection: str
    embed: Callable[[nn.Module, torch.Tensor], torch.Tensor]
    chunkable: bool = False

    @property
    def post(self) -> tuple[str, ...]:
        return self.norm, self.projection


def split_of(model: nn.Module) -> PipelineSplit:
    """The split ``model`` declares, or one line saying it has none."""
    declared = getattr(model, "pipeline_split", None)
    if declared is None:
        raise UsageError(f"pipeline parallelism needs a stage split for {type(model).__name__}; "
                         "splits exist for the built-in gpt2 and llama families")
    return declared()


def chunks_per_rank(schedule: str, virtual: int) -> int:
    return virtual if schedule in MULTI else 1


class Chunk(nn.Module):
    """Consecutive blocks of a model, with the embeddings when first and the head when last."""

    def __init__(self, model: nn.Module, family: PipelineSplit, start: int, end: int,
                 first: bool, last: bool) -> None:
        super().__init__()
        self.first, self.last, self._family = first, last, family
        for name in (family.pre if first else ()) + (family.post if last else ()):
            setattr(self, name, getattr(model, name))
        self.layers = nn.ModuleList(list(getattr(model, family.blocks))[start:end])
        self.skip_head = False  # set by a chunked loss, which runs the projection itself
        if last and family.chunkable:
            self.chunkable_head = functools.partial(getattr, self, family.projection)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._run(x, blocks=True)

    def without_blocks(self, x: torch.Tensor) -> torch.Tensor:
        """The forward without the blocks, only what comes before and after them: the stage
        shapes, a block keeping its input's shape (``stage_shapes``)."""
        return self._run(x, blocks=False)

    def _run(self, x: torch.Tensor, blocks: bool) -> torch.Tensor:
        if self.first:
            x = self._family.embed(self, x)
        for layer in self.layers if blocks else ():
            x = layer(x)
        if self.last:
            x = getattr(self, self._family.norm)(x)
            if not self.skip_head:
                x = getattr(self, self._family.projection)(x)
        return x


def block_count(model: nn.Module) -> int:
    """The repeated blocks a pipeline splits (the model's declared ``pipeline_split``)."""
    return len(getattr(model, split_of(model).blocks))


@contextlib.contextmanager
def held_blocks_only(model: nn.Module, execution: Execution, rank: int) -> Iterator[None]:
    """Inside: ``model``'s blocks are only those of the chunks pipeline rank ``rank`` holds, so
    the engines applied before the split (tensor and expert parallelism) touch nothing else.
    After: every block is back in its place, the others as they were built, and no rank runs
    them (the stage shapes need no block: ``stage_shapes``); they stay blocks of the model's
    class, so that what finds the repeated blocks (activation checkpointing's
    ``repeated_blocks``) finds the same ones. Why: a traced stage is built from the whole
    model, and tensor parallelism over the blocks of every chunk cost a plan's search as much
    again as over the rank's own."""
    family = split_of(model)
    blocks = getattr(model, family.blocks)
    starts = [0, *itertools.accumulate(execution.chunk_layers(len(blocks)))]
    mine = rank_stages(rank, execution.pipeline, execution.pipeline_schedule or "", execution.virtual_stages)
    held = [i for s in mine for i in range(starts[s], starts[s + 1])]
    setattr(model, family.blocks, nn.ModuleList([blocks[i] for i in held]))
    try:
        yield
    finally:
        applied = dict(zip(held, getattr(model, family.blocks), strict=True))
        setattr(model, family.blocks, nn.ModuleList([applied.get(i, b) for i, b in enumerate(blocks)]))


def split(model: nn.Module, layers: Sequence[int]) -> list[Chunk]:
    """The chunks of ``model``, the ``i``-th holding ``layers[i]`` consecutive blocks (the
    layout's ``Execution.chunk_layers``): every chunk one or more, but the first and the last,
    which hold the embedding and the head and may hold no block (Llama 3 405B's)."""
    family = split_of(model)
    n = len(getattr(model, family.blocks))
    if sum(layers) != n or min(layers[1:-1], default=1) < 1 or min(layers) < 0:
        raise UsageError(f"a split of {'+'.join(map(str, layers))} blocks does not hold the model's {n} blocks")
    starts = [0, *itertools.accumulate(layers)]
    return [Chunk(model, family, starts[s], starts[s + 1], s == 0, s == len(layers) - 1) for s in range(len(layers))]


class _MicroLoss:
    """The workload's loss on one micro-batch: its per-sample targets cut to the micro-batch
    (every micro-batch costs the same; which samples does not matter to a trace)."""

    def __init__(self, loss: Callable[[Any], torch.Tensor], batch: int, micro: int,
                 autocast: Callable[[], Any]) -> None:
        self.loss = _sliced(loss, batch, micro)
        self.autocast = autocast
        self.watch: Any = None

    def __call__(self, output: Any, target: Any) -> torch.Tensor:
        if self.watch is not None:
            self.watch.loss_starts()
        try:
            with self.autocast():
                return self.loss(output)
        finally:
            if self.watch is not None:
                self.watch.loss_ends()


def _sliced(obj: Any, batch: int, micro: int) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj[:micro] if obj.dim() and obj.shape[0] == batch else obj
    if hasattr(obj, "__dict__") and not isinstance(obj, nn.Module | type):
        clone = copy.copy(obj)
        for key, value in vars(obj).items():
            setattr(clone, key, _sliced(value, batch, micro))
        return clone
    return obj


class PipelineRank(nn.Module):
    """One rank's chunks (``stages``) and the schedule that runs them; ``Step.run`` calls
    ``run_pipeline`` in place of forward, loss and backward."""

    def __init__(self, chunks: list[Chunk], stage_indices: list[int], num_stages: int, schedule: str,
                 micro_batches: int, inputs: tuple[Any, ...], loss_fn: Callable[[Any], torch.Tensor],
                 group: Any, shapes: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        super().__init__()
        self.stages = nn.ModuleList(chunks)
        self.stage_indices, self.num_stages = stage_indices, num_stages
        self.schedule_name, self.micro_batches = schedule, micro_batches
        self.pipeline_inputs, self.loss_fn, self.group, self.shapes = inputs, loss_fn, group, shapes
        self.pipeline_order: dict[int, list[Any]] = {}

    def forward(self, *inputs: Any) -> Any:  # pragma: no cover - the schedule runs the chunks
        raise RuntimeError("a pipeline rank runs through run_pipeline")

    def build_schedule(self, autocast: Callable[[], Any]) -> Any:
        from torch.distributed.pipelining import (
            PipelineStage,
            Schedule1F1B,
            ScheduleGPipe,
            ScheduleInterleaved1F1B,
            ScheduleInterleavedZeroBubble,
        )

        stages = [PipelineStage(chunk, index, self.num_stages, torch.device("cpu"), input_args=shape[0],
                                output_args=shape[1], group=self.group)
                  for chunk, index, shape in zip(self.stages, self.stage_indices, self.shapes, strict=True)]
        batch = self.pipeline_inputs[0].shape[0]
        loss = _MicroLoss(self.loss_fn, batch, batch // self.micro_batches, autocast)
        kinds = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
        if self.schedule_name in kinds:
            schedule = kinds[self.schedule_name](stages[0], self.micro_batches, loss_fn=loss)
        else:
            multi = {"interleaved-1f1b": ScheduleInterleaved1F1B,
                     "zero-bubble": ScheduleInterleavedZeroBubble}[self.schedule_name]
            schedule = multi(stages, self.micro_batches, loss_fn=loss)
        self.pipeline_order = {r: [str(a) for a in actions if a is not None]
                               for r, actions in (schedule.pipeline_order or {}).items()}
        schedule._warmup_p2p = _static_shapes
        return schedule, stages, loss

    def run_pipeline(self, autocast: Callable[[], Any], watch: Any) -> None:
        schedule, stages, loss = self.build_schedule(autocast)
        loss.watch = watch
        for stage, (_, output) in zip(stages, self.shapes, strict=True):
            _watch_actions(stage, watch, autocast, output)
        batch = self.pipeline_inputs[0].shape[0]
        first = any(s.is_first for s in stages)
        last = any(s.is_last for s in stages)
        target = torch.empty(batch, 0) if last else None
        args = self.pipeline_inputs if first else ()
        with quiet_fsdp_view_warning():  # the schedule sends or scores a stage's output, never writes it
            schedule.step(*args, target=target, return_outputs=False)


def _static_shapes(stages: list[Any], has_backward: bool, p2p_done: bool) -> None:
    """The first step's vote among the stages (``_warmup_p2p``) decides that shapes are static
    when every stage was given them, as here; a fake process group cannot carry the vote, so
    the decision is set directly. The vote is first-step set-up: not part of a steady step."""
    from torch.distributed.pipelining.stage import InferenceMode

    for stage in stages:
        stage._inference_mode = InferenceMode.STATIC


def _watch_actions(stage: Any, watch: Any, autocast: Callable[[], Any], output: torch.Tensor) -> None:
    """Tell the recorder where each forward, backward and weight-gradient chunk starts and
    ends (``F3@1``: stage 1's forward of micro-batch 3; ``B`` full backward, ``I`` input
    gradients only, ``W`` weight gradients), forward under autocast as a training step runs it;
    each forward's output checked against the stage's declared ``output``."""
    index = stage.stage_index
    forward, backward, weight = stage.forward_one_chunk, stage.backward_one_chunk, stage.backward_weight_one_chunk

    @functools.wraps(forward)
    def forward_chunk(chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        watch.action_starts(f"F{chunk_id}@{index}", "forward")
        try:
            with autocast():
                produced = forward(chunk_id, *args, **kwargs)
        finally:
            watch.action_ends()
        _check_shape(index, produced, output)
        return produced

    @functools.wraps(backward)
    def backward_chunk(chunk_id: int, loss: Any = None, full_backward: bool = True, **kwargs: Any) -> Any:
        outputs = stage.fwd_cache.get(chunk_id, ((),))[0]
        watch.action_starts(f"{'B' if full_backward else 'I'}{chunk_id}@{index}", "backward",
                            [loss] if loss is not None else list(outputs))
        try:
            return backward(chunk_id, loss=loss, full_backward=full_backward, **kwargs)
        finally:
            watch.action_ends()

    @functools.wraps(weight)
    def weight_chunk(chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        watch.action_starts(f"W{chunk_id}@{index}", "backward", [])
        try:
            return weight(chunk_id, *args, **kwargs)
        finally:
            watch.action_ends()

    stage.forward_one_chunk, stage.backward_one_chunk = forward_chunk, backward_chunk
    stage.backward_weight_one_chunk = weight_chunk


def stage_shapes(chunks: list[Chunk], inputs: tuple[Any, ...], micro: int, autocast: Callable[[], Any],
                 dtype: torch.dtype | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each chunk's (input, output) on one micro-batch, from a forward through the chunks
    without their blocks (``Chunk.without_blocks``: embeddings, final norm and head) under
    ``no_grad``, unrecorded (placeholders no GPU runs): a block keeps its input's shape, dtype
    and strides (the residual stream), which each traced forward checks (``_watch_actions``), so
    no block runs here. ``dtype``: the data-parallel engine's forward dtype
    (``data.forward_dtype``, applied after this runs), the floating tensors' between stages."""
    def like(t: torch.Tensor) -> torch.Tensor:  # an activation carries a gradient back
        floating = t.is_floating_point()
        return torch.empty_like(t, dtype=dtype if dtype and floating else t.dtype).requires_grad_(floating)

    x = inputs[0][:micro]
    with unrecorded():
        with torch.no_grad(), autocast():
            outputs = []
            for chunk in chunks:
                out = chunk.without_blocks(x)
                outputs.append((x, out))
                x = out
        return [(like(a), like(b)) for a, b in outputs]


def _check_shape(stage: int, output: Any, expected: torch.Tensor) -> None:
    """One line where a chunk's output is not what its stage declared (``stage_shapes``)."""
    def meta(t: Any) -> tuple[Any, ...]:
        return (tuple(t.shape), t.dtype, t.stride()) if isinstance(t, torch.Tensor) else (type(t).__name__,)

    if meta(output) != meta(expected):
        raise RuntimeError(f"pipeline stage {stage} produced {meta(output)}, not the {meta(expected)} its "
                           "stage shapes declared: the split assumes its blocks keep their input's shape, "
                           "dtype and strides")


def schedule_order(schedule: str, pipeline: int, virtual: int, micro: int) -> dict[int, list[str]]:
    """Every rank's actions of a multi-stage schedule for ``micro`` micro-batches, as torch's own
    ``_calculate_single_rank_operations`` (and zero-bubble's bubble insertion) plans them, without
    a process group: what ``pipeline_order`` holds once the schedule is built on real stages."""
    from torch.distributed.pipelining.schedules import (
        ScheduleInterleaved1F1B,
        ScheduleInterleavedZeroBubble,
    )

    kind = {"interleaved-1f1b": ScheduleInterleaved1F1B, "zero-bubble": ScheduleInterleavedZeroBubble}[schedule]
    plan = kind.__new__(kind)
    plan.pp_group_size, plan.n_local_stages, plan._n_microbatches = pipeline, virtual, micro
    plan.number_of_rounds = max(1, micro // pipeline)
    plan.microbatches_per_round = micro // plan.number_of_rounds
    plan.pipeline_order = {r: plan._calculate_single_rank_operations(r) for r in range(pipeline)}
    if schedule == "zero-bubble":
        plan.pipeline_order = plan._add_bubbles_to_actions(virtual * pipeline)
    return {r: [str(a) for a in actions if a is not None] for r, actions in plan.pipeline_order.items()}


def rank_stages(rank: int, pipeline: int, schedule: str, virtual: int) -> list[int]:
    """The stage indices rank ``rank`` of the pipeline group holds (loop placement)."""
    return [rank + k * pipeline for k in range(chunks_per_rank(schedule, virtual))]


def pipeline_rank(workload: Workload, execution: Execution, options: TraceOptions, pp_mesh: Any) -> nn.Module:
    """This rank's pipeline chunks and the schedule that runs them over the pipeline group."""
    from nnperf.trace.loss import loss_for
    from nnperf.trace.options import AMP_DTYPES
    from nnperf.trace.parallel.data import forward_dtype

    def autocast() -> Any:
        if not options.amp:
            return contextlib.nullcontext()
        return torch.autocast("cpu", dtype=AMP_DTYPES[options.amp])

    stages = execution.chunks
    chunks = split(workload.model, execution.chunk_layers(block_count(workload.model)))
    batch = workload.inputs[0].shape[0]
    if batch % execution.grad_accum:
        raise UsageError(f"a batch of {batch} does not split into {execution.grad_accum} micro-batches")
    mine = rank_stages(pp_mesh.get_local_rank(), execution.pipeline, execution.pipeline_schedule or "",
                       execution.virtual_stages)
    # a chunked loss runs the last chunk's output projection (torchtitan's ChunkedLossWrapper on
    # the last stage); on the other ranks no loss runs
    last = stages - 1 in mine
    loss = loss_for(workload.loss_fn or default_loss, options.loss if last else "eager", chunks[-1])
    # the shapes of this rank's chunks need the forward up to its last chunk only
    shapes = stage_shapes(chunks[:max(mine) + 1], tuple(workload.inputs), batch // execution.grad_accum, autocast,
                          forward_dtype(execution, options.amp))
    return PipelineRank([chunks[i] for i in mine], mine, stages, execution.pipeline_schedule or "",
                        execution.grad_accum, tuple(workload.inputs), loss, pp_mesh.get_group(),
                        [shapes[i] for i in mine])


__all__ = ["Chunk", "PipelineRank", "PipelineSplit", "block_count", "held_blocks_only", "pipeline_rank",
           "rank_stages", "schedule_order", "split", "split_of", "stage_shapes"]
