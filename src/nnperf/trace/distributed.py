"""One rank's step of a multi-GPU layout, traced with PyTorch's own engines.

``trace_rank`` builds the model on fake tensors, applies the layout's engines
(``trace.parallel.apply_layout``: ``parallelize_module`` with the model's plan, expert
parallelism, pipeline stages, then ``DistributedDataParallel`` or FSDP2's ``fully_shard`` on
the data-parallel part of the device mesh) under a fake process group (``trace.fake_world``)
and records one step of one rank: its shard sizes, optimizer state and every collective, in
order, come from the engine, not from a closed form. Data- and tensor-parallel ranks all play
the same role (up to uneven shards of a vocabulary, which ``rank`` selects), so one trace is
the whole layout. The layout is ``nnperf.layout.Execution``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist
from torch import nn

from nnperf.errors import UsageError
from nnperf.kernels.engines import TRANSFORMER_ENGINE
from nnperf.layout import Execution
from nnperf.trace.blocks import block_names, mark_blocks
from nnperf.trace.capture import cast_workload, trace_workload
from nnperf.trace.collectives import Collective, collectives_of, on_own_groups
from nnperf.trace.engine_patches import engines_on_fake_tensors
from nnperf.trace.events import Trace
from nnperf.trace.fake_world import session
from nnperf.trace.fp8_casts import in_fp8, megatron_fp8_casts
from nnperf.trace.fp8_saved_inputs import keep_fp8_saved_inputs
from nnperf.trace.fsdp_shards import one_rank_chunks
from nnperf.trace.fused_expert_fc1 import fused_expert_fc1
from nnperf.trace.options import TraceOptions
from nnperf.trace.parallel import apply_layout, build_meshes
from nnperf.trace.parallel.sequence_first import batch_first_copies
from nnperf.workload import Workload


@dataclass
class RankTrace:
    """One rank's traced step and what the engine communicated in it."""

    execution: Execution
    trace: Trace
    workload: Workload
    collectives: list[Collective] = field(default_factory=list)


def trace_rank(
    build: Callable[[], Workload], options: TraceOptions, execution: Execution,
    units: Callable[[nn.Module], list[str]], prepare: Callable[[Workload], Any] | None = None,
    rank: int = 0,
) -> RankTrace:
    """Trace ``rank``'s step of ``execution``. ``units``: the names of the repeated blocks FSDP2
    shards as one unit each (torchtitan's per-transformer-block wrapping); ``prepare``: applied to the
    built workload before the engine wraps it (activation checkpointing)."""
    execution.validate()
    if execution.shards_optimizer_only and (options.optimizer == "none" or not options.train):
        raise UsageError("zero1 shards the optimizer state, and this step has no optimizer: use ddp")
    if execution.context > 1:
        raise UsageError("context parallelism is not traced: nnperf plan models its ring attention in "
                         "closed form on a traced rank (search.plan.context)")
    if execution.shards_optimizer_only and options.uses_grad_scaler() and options.dtype in ("bf16", "fp16"):
        raise UsageError("zero1 of a 16-bit model (--dtype) with a GradScaler is not traced: its fp32 main "
                         "gradients exist only inside the optimizer's step; use --amp fp16 on the fp32 model, or ddp")
    if execution.pipeline > 1 and options.uses_grad_scaler():
        raise UsageError("pipeline parallelism with fp16 autocast (a GradScaler) is not traced; use --amp bf16")

    if execution.pipeline > 1:
        # torch's pipelining makes a tensor when it is first imported (microbatch.py's
        # sum_reducer): imported before the fake mode and the recorder, or the first pipeline
        # trace of a process would record it and the next ones not
        import torch.distributed.pipelining  # noqa: F401

    world = session(execution.world, rank)
    # torchtitan's loss parallelism (the logits stay split over the vocabulary) needs the loss
    # and its backward under ``loss_parallel()``: the whole step runs under it; its custom
    # handlers touch only cross entropy's ops on DTensors
    step_contexts = contextlib.ExitStack()
    with engines_on_fake_tensors(world["memo"]), one_rank_chunks():
        # The mesh is made on real tensors (it reads its rank table), before the fake mode.
        # the meshes of one shape, and the expert group they make (folded over the
        # tensor-parallel ranks or not: ``Execution.folds_experts``)
        shape = (*execution.mesh_shape(), ("folded experts", execution.folds_experts))
        if shape not in world["meshes"]:
            world["meshes"][shape] = build_meshes(execution)

        def build_distributed() -> Workload:
            # --dtype casts the model before the engines wrap it, as Megatron-LM's Float16Module
            # does: their shards, stage shapes and buckets are in that dtype
            workload = cast_workload(build(), options.dtype)
            if options.fp8 or options.pointwise == "fused":  # while every block is in the model
                mark_blocks(workload.model)
            return apply_layout(workload, execution, options, world["meshes"][shape], units, prepare,
                                step_contexts)

        with step_contexts:
            trace, workload = trace_workload(build_distributed, options, meta_first=False)
        collectives = on_own_groups(collectives_of(trace), _groups_of(world["meshes"][shape]))
    trace.config["execution"] = execution.to_json()
    if execution.megatron_layout:  # Megatron-Core attends through Transformer Engine, not SDPA,
        trace.config["attention_engine"] = TRANSFORMER_ENGINE
        # and its linear layers are TE's: their FP8 casts, the experts' GroupedLinear (TEGroupedMLP)
        trace.config["linear_engine"] = TRANSFORMER_ENGINE
        # whose gate and up projections are one layer (linear_fc1)
        fused = fused_expert_fc1(trace)
        if fused.groups:
            trace.config["fused_linears"] = fused.groups
            trace.config["fused_sums"] = fused.sums
    trace.config["rank"] = rank
    def tensor_group() -> str:  # the mesh's tensor-parallel group (its first dimension)
        return world["meshes"][shape][0].get_group().group_name

    # the tensor-parallel group Megatron-LM's sequence parallelism gathers and scatters over
    tp_group = tensor_group() if execution.megatron_sequence_parallel else None
    if tp_group is not None:
        # ... on sequence-first tensors, without the copies a batch-first trace makes around them
        trace.config["not_copied"] = batch_first_copies(trace, collectives, tp_group)
    if options.fp8 and execution.megatron_layout:
        # Transformer Engine's linears, which Megatron-LM runs, and its experts' GroupedLinear
        # (FP8 under the same recipe: passes.timing) keep their inputs in FP8
        trace.config["fp8_experts"] = True
        saved = keep_fp8_saved_inputs(trace, experts=True)
        trace.config["fp8_saved_inputs"] = saved.copies
        # or, where the 16-bit input is kept anyway, that original: cast again in backward
        trace.config["fp8_recast_inputs"] = saved.recast
        trace.config["fp8_rowwise_casts"] = sorted(saved.rowwise_only)
    # torchtitan's sequence parallelism with float8 linears: torchao's tensor-parallel styles
    # (float8/float8_tensor_parallel.py: Float8ColwiseParallel, Float8RowwiseParallel,
    # PrepareFloat8ModuleInput, which torchtitan's apply_tp takes with float8) cast a module's
    # input shard to float8 before its all-gather, once for the attention's and the feed-forward's
    # linears, and an output's gradient before the all-gather backward makes of its reduce-scatter
    # (dense models: a mixture of experts with tensor parallelism is planned as Megatron-LM runs it)
    fp8_sequence_parallel = execution.tensor > 1 and execution.sequence_parallel and not execution.megatron_layout
    if options.fp8 and (execution.megatron_layout or fp8_sequence_parallel):
        # ... as Transformer Engine casts a sequence-parallel shard before gathering it, a fused
        # layer's input once
        tp = tensor_group() if fp8_sequence_parallel else tp_group
        gathers = frozenset(c.index for c in collectives if c.kind == "all_gather" and c.group == tp)
        casts = megatron_fp8_casts(trace, gathers, execution.tensor)
        trace.config["fp8_cast_shares"] = casts.shares
        # ... so that gather moves one byte an element
        collectives = [in_fp8(c, trace) if c.index in casts.fp8_gathers else c for c in collectives]
    if tp_group is not None or execution.async_tp:
        # the tensor-parallel group and the repeated blocks (as the trace names modules): what
        # Megatron-LM's linears, Transformer Engine's userbuffers and torch's async tensor
        # parallelism overlap with their GEMMs (``search.plan.rank.tensor_parallel_chunks``)
        trace.config["tensor_parallel_group"] = tp_group or tensor_group()
        trace.config["blocks"] = block_names(workload.model)
    if execution.data_parallel > 1:
        # the data-parallel engine's process groups: a pipeline synchronizes over them once per
        # step (DDP's reduction in the last micro-batch's backward, ZeRO-1's all-gather before
        # the first forward; FSDP2, which pipelines never reshard, gathers once and
        # reduce-scatters after the schedule), not once per micro-batch; so does DDP (and
        # ZeRO-1) accumulating without a pipeline (``no_sync`` micro-batches, Megatron-LM's
        # reduction in the last one)
        trace.config["data_parallel_groups"] = _data_parallel_groups(execution, world["meshes"][shape])
    if execution.pipeline > 1:
        trace.config["pipeline_order"] = workload.model.pipeline_order
        trace.config["pipeline_stages"] = list(workload.model.stage_indices)
    return RankTrace(execution, trace, workload, collectives)


def import_engines() -> None:
    """Import what the first trace of a rank would import on first use: the engines (DTensor's
    parallel styles, FSDP2, DDP's hooks, pipelining), TorchDynamo (which ``torch._disable_dynamo``
    wrappers on those engines' functions import when first called) and the data-parallel
    appliers. A search imports them once before it forks its workers, which then share them,
    instead of each worker importing them again (about a second each)."""
    import importlib

    for name in ("torch._dynamo", "torch._subclasses.schema_check_mode", "torch.utils.checkpoint",
                 "torch.distributed.tensor.parallel", "torch.distributed.fsdp", "torch.distributed.pipelining",
                 "torch.distributed.algorithms.ddp_comm_hooks", "nnperf.trace.parallel.data",
                 "nnperf.trace.parallel.distributed_optimizer"):
        importlib.import_module(name)


def _groups_of(meshes: tuple[Any, ...]) -> list[Any]:
    """Every process group of a layout's meshes, and the default group."""
    return [*(mesh.get_group(i) for mesh in meshes if mesh is not None for i in range(mesh.ndim)),
            dist.group.WORLD]


def _data_parallel_groups(execution: Execution, meshes: tuple[Any, ...]) -> list[str]:
    """The names of the process groups the layout's data-parallel engine communicates over."""
    _, dp_mesh, _, _, experts_mesh = meshes
    if execution.replicates_parameters and execution.data_parallel == execution.world:
        names = [dist.group.WORLD.group_name]  # DDP alone runs on the default group
    else:
        names = [dp_mesh.get_group(i).group_name for i in range(dp_mesh.ndim)]
    if experts_mesh is not None:
        names += [experts_mesh.get_group(i).group_name for i in range(experts_mesh.ndim)]
    return names


def sharded_bytes(trace: RankTrace) -> dict[str, int]:
    """Per-rank parameter, gradient and optimizer-state bytes of the traced step."""
    from nnperf.trace.events import KIND_GRAD, KIND_OPT_STATE, KIND_PARAM

    totals = {"parameters": 0, "gradients": 0, "optimizer_state": 0}
    names = {KIND_PARAM: "parameters", KIND_GRAD: "gradients", KIND_OPT_STATE: "optimizer_state"}
    for info in trace.trace.storages.values():
        key = names.get(info.kind)
        if key is not None:
            totals[key] += info.nbytes
    return totals


__all__ = ["RankTrace", "import_engines", "sharded_bytes", "trace_rank"]
