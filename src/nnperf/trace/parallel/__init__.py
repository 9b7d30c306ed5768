"""Each parallelism strategy applied to a built workload, one module per strategy, and the
one function that applies a layout's strategies in order (``apply_layout``).

- ``tensor``: tensor (and sequence) parallelism, ``parallelize_module`` with the plan the model
  declares (``tensor_parallel_plan()``), and torchtitan's loss parallelism (for Megatron-LM's
  layouts Megatron-Core's cross entropy, ``vocab_parallel_loss``, and embedding,
  ``vocab_parallel_embedding``);
- ``expert``: expert parallelism of the zoo's mixture-of-experts layers (torchtitan's, on
  DTensor), and FSDP2 over the experts' weights outside the expert group;
- ``pipeline``: ``torch.distributed.pipelining`` stages and schedules over the split the model
  declares (``pipeline_split()``);
- ``data``: DDP (ZeRO-1 beside it) or FSDP2 / HSDP.

Context parallelism is not applied to a workload: the plan models it in closed form on a traced
rank (``search.plan.context``). The layout itself, and the names of its choices, are
``nnperf.layout``.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from typing import Any

from torch import nn

from nnperf.errors import UsageError
from nnperf.layout import Execution
from nnperf.trace.options import TraceOptions
from nnperf.workload import Workload


def apply_layout(workload: Workload, execution: Execution, options: TraceOptions, meshes: tuple[Any, ...],
                 units: Callable[[nn.Module], list[str]], prepare: Callable[[Workload], Any] | None,
                 step_contexts: contextlib.ExitStack, real: bool = False) -> Workload:
    """Apply the layout's engines to a built workload, in torchtitan's order: tensor and expert
    parallelism, activation checkpointing (``prepare``), the pipeline stages, then DDP or FSDP2.
    ``meshes``: ``build_meshes(execution)``; ``step_contexts`` receives what the step must run
    under (loss parallelism); ``real``: a real process group (``measure.distributed``), where
    DDP runs as users run it, not with the fake process group's steady-state reducer and hook."""
    from nnperf.trace.parallel.data import apply_data_parallel
    from nnperf.trace.parallel.expert import has_experts

    tp_mesh, dp_mesh, pp_mesh, ep_mesh, experts_dp_mesh = meshes
    if real and execution.optimizer_states == "bf16-moments":
        raise UsageError("optimizer states bf16-moments are planned, not run on GPUs: their step is Transformer "
                         "Engine's FusedAdam, which PyTorch's AdamW is not; plan the layout with "
                         "--optimizer-states fp32 to measure it")
    # the model's experts, though a shallow trace or a pipeline rank's blocks may hold none (DeepSeek's
    # leading dense blocks)
    experts = workload.info.get("config", {}).get("n_experts") or has_experts(workload.model)
    with _rank_blocks(workload.model, execution, pp_mesh):
        held_experts = bool(has_experts(workload.model))  # this rank's blocks'
        split_experts = execution.tensor > 1 and held_experts
        if split_experts and not execution.carries_split_experts:
            raise UsageError("a mixture of experts with tensor parallelism is modelled as Megatron-LM runs it, "
                             f"with --data ddp or zero1 ({execution.data} is torchtitan's, whose expert tensor "
                             "parallelism is not modelled); or lay the experts out with --ep and --tp 1")
        if split_experts and real:
            raise UsageError("a mixture of experts with tensor parallelism is planned, not run on GPUs: the split "
                             "experts' all-gather of rows assumes every tensor-parallel rank routes alike, as the "
                             "trace does, and the folded expert group is checked on traced ranks only")
        if real and execution.token_dispatcher != "alltoall" and held_experts:
            raise UsageError(f"the {execution.token_dispatcher} token dispatcher is planned, not run on GPUs: a "
                             "measured layout sends its tokens by NCCL's all-to-all; plan it with --dispatcher "
                             "alltoall to measure it")
        if split_experts and execution.folds_experts:
            from nnperf.trace.parallel.expert_tensor import keep_experts_whole

            keep_experts_whole(workload.model)
        if execution.tensor > 1:
            from nnperf.trace.parallel.tensor import apply_tensor_parallel, check_divisible

            check_divisible(workload.model, workload.info.get("config", {}), execution.tensor,
                            execution.sequence_parallel, workload.info.get("seq_len"))
            if apply_tensor_parallel(workload.model, tp_mesh, execution.sequence_parallel,
                                     loss_parallel=execution.splits_logits,
                                     keep_shards=execution.keeps_sequence_shards):
                step_contexts.enter_context(_loss_parallel())
            if execution.megatron_tensor_parallel:
                from nnperf.trace.parallel.vocab_parallel_embedding import MegatronEmbedding

                step_contexts.enter_context(MegatronEmbedding())
        from nnperf.trace.parallel.vocab_parallel_loss import (
            MegatronCrossEntropy,
            runs_megatron_loss,
        )

        if runs_megatron_loss(execution, options):  # over the logits' vocabulary slice, or whole at TP 1
            step_contexts.enter_context(MegatronCrossEntropy(whole=execution.tensor == 1, fused=execution.loss_fusion))
        if execution.expert > 1 or split_experts:
            from nnperf.trace.parallel.expert import apply_experts

            apply_experts(workload.model, execution.expert, ep_mesh, experts)
    if prepare is not None:
        prepare(workload)
    parts = [workload.model]
    if execution.pipeline > 1:
        from nnperf.trace.parallel.pipeline import pipeline_rank

        workload.model = pipeline_rank(workload, execution, options, pp_mesh)
        parts = list(workload.model.stages)
    if not execution.applies_data_engine:
        return workload
    if execution.expert > 1 and not execution.replicates_parameters:
        from nnperf.trace.parallel.expert import explicit_prefetch, shard_experts

        for part in parts:
            shard_experts(part, experts_dp_mesh, execution, options.amp)
        apply_data_parallel(workload, parts, execution, options.amp, dp_mesh, units, real, tp_mesh)
        for part in parts:
            explicit_prefetch(part, units(part))
        return workload
    # DDP / ZeRO-1 with experts: their gradients reduced over their own group (None without)
    apply_data_parallel(workload, parts, execution, options.amp, dp_mesh, units, real, tp_mesh,
                        experts_mesh=experts_dp_mesh, expert_mesh=ep_mesh)
    return workload


def _rank_blocks(model: nn.Module, execution: Execution, pp_mesh: Any) -> Any:
    """With pipeline parallelism, only the blocks of this rank's chunks while tensor and expert
    parallelism apply (``pipeline.held_blocks_only``)."""
    if execution.pipeline == 1:
        return contextlib.nullcontext()
    from nnperf.trace.parallel.pipeline import held_blocks_only

    return held_blocks_only(model, execution, pp_mesh.get_local_rank())


def _loss_parallel() -> Any:
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel()


def build_meshes(execution: Execution, device_type: str = "cpu") -> tuple[Any, Any, Any, Any, Any]:
    """The tensor-, data- and pipeline-parallel (sub)meshes, sliced from one device mesh, and
    with expert parallelism the expert group and the data-parallel mesh of the experts' weights
    (torchtitan's ``ep`` and ``dp_shard_mod_ep``; under DDP or ZeRO-1, Megatron-LM's expert
    model-parallel and expert-data-parallel groups). A mesh reads its rank table with real
    tensors: made and sliced before the fake mode starts."""
    from torch.distributed.device_mesh import init_device_mesh

    names, sizes = zip(*execution.mesh_shape(), strict=True)
    mesh = init_device_mesh(device_type, sizes, mesh_dim_names=names)
    expert_mesh = experts_data = None
    carved = execution.expert_carved_from
    if execution.expert > 1:
        mesh[f"{carved}_mod_expert", "expert"]._flatten(carved)
        # folded (Megatron-Core's MoE parallel folding), the expert group spans the
        # tensor-parallel ranks too
        expert_mesh = mesh["expert", "tensor"]._flatten("expert_tensor") if execution.folds_experts else mesh["expert"]
        experts_data = mesh[("replicate", "shard_mod_expert") if execution.data == "hsdp" else f"{carved}_mod_expert"]
    data = ("replicate", "shard") if execution.data == "hsdp" else (carved if execution.expert > 1 else names[1:2])
    with warnings.catch_warnings():
        # torchtitan slices its flattened data mesh ("dp_shard" over dp_shard_mod_ep x ep) the same way
        warnings.filterwarnings("ignore", "Slicing a flattened dim", UserWarning)
        return mesh["tensor"], mesh[data], mesh["pipeline"], expert_mesh, experts_data
