"""Tensor parallelism of mixture-of-experts layers as Megatron-Core runs it (its
``MoEAlltoAllTokenDispatcher`` with the experts' tensor-parallel size that of the dense layers,
the default before ``--expert-tensor-parallel-size``):

- Megatron-Core requires sequence parallelism with MoE and tensor parallelism: each rank routes
  its own sequence shard of tokens (the layer's input as the norm left it, no all-gather); the
  router's weight is the same on every tensor-parallel rank, its gradient all-reduced over them
  (a sequence-parallel parameter);
- every expert's feed-forward is split as a dense one is: ``w1``/``w3`` by output columns,
  ``w2`` by input rows, each rank holding ``hidden / tp`` of every expert it holds;
- dispatch: the routed rows go to their experts' rank (the all-to-all over the expert group,
  ``trace.parallel.expert``), then an all-gather over the tensor-parallel group gives each rank
  every row its tensor-parallel peers received, regrouped by local expert; combine: the
  experts' partial outputs reduce-scattered over the tensor-parallel group, then the reverse
  all-to-all (the dispatcher's "permute, A2A(EP), AG(TP), sort" and "sort, RS(TP), A2A(EP),
  unpermute");
- shared experts (DeepSeek's) are a dense SwiGLU beside the routed ones, split as one
  (``split_shared_expert``).

Where the expert degree does not divide the data-parallel ranks but folds over the
tensor-parallel ones (``Execution.folds_experts``: Megatron-Core's MoE parallel folding with an
expert tensor-parallel size of 1, as Qwen3 235B's EP 32 beside TP 2 and 16 data-parallel ranks),
each expert stays whole and the expert group spans the tensor-parallel ranks: the rows travel by
the all-to-all alone (``keep_experts_whole``).

torchtitan's expert tensor parallelism differs (each rank routes the whole gathered sequence),
and is not modelled: its layouts (FSDP2) refuse a mixture of experts with tensor parallelism.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import nn

from nnperf.errors import UsageError
from nnperf.trace.parallel.tensor import replicate_own_parameters, shard_start, styles

#: The tensor-parallel mesh of each ``GroupedExperts`` split by ``split_moe`` (its dispatch
#: gathers and reduce-scatters the rows over it: ``trace.parallel.expert``).
EXPERT_TENSOR_MESH: weakref.WeakKeyDictionary[nn.Module, Any] = weakref.WeakKeyDictionary()
#: ``GroupedExperts`` that ``split_moe`` leaves whole: MoE parallel folding, where the expert
#: group spans the tensor-parallel ranks (``Execution.folds_experts``).
WHOLE_EXPERTS: weakref.WeakSet[nn.Module] = weakref.WeakSet()


def keep_experts_whole(model: nn.Module) -> None:
    """Megatron-Core's MoE parallel folding (expert tensor parallelism 1): ``split_moe`` keeps
    every expert of ``model`` whole, for expert parallelism to place each on one rank of an
    expert group that spans the tensor-parallel ranks; each rank still routes its sequence shard."""
    from nnperf.zoo.moe import GroupedExperts

    for module in model.modules():
        if isinstance(module, GroupedExperts):
            WHOLE_EXPERTS.add(module)


def split_moe(moe: nn.Module, mesh: Any, sequence_parallel: bool) -> None:
    """Split one ``zoo.moe.MoE`` over the tensor-parallel ``mesh`` (module docstring)."""
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module
    from torch.distributed.tensor.parallel import PrepareModuleInput, parallelize_module

    if not sequence_parallel:
        raise UsageError("a mixture of experts with tensor parallelism needs sequence parallelism, as "
                         "Megatron-Core requires (--sequence-parallel): each rank routes its sequence shard")
    if moe.shared_expert is not None:
        split_shared_expert(moe.shared_expert, mesh)
    experts = moe.experts
    hidden = experts.w1.shape[1]
    whole = experts in WHOLE_EXPERTS
    if not whole and hidden % mesh.size():
        raise UsageError(f"tensor parallel degree {mesh.size()} does not divide the experts' hidden size "
                         f"{hidden}")
    # every expert weight held as the DTensor it is (the optimizer's foreach steps take no mix of
    # DTensors and plain tensors): whole and replicated where the experts fold over the
    # tensor-parallel ranks, else this rank's slice of every expert's hidden dimension; expert
    # parallelism then shards it over the expert group (``trace.parallel.expert``)
    width, start = hidden // mesh.size(), shard_start(hidden, mesh)
    for name, dim in (("w1", 1), ("w3", 1), ("w2", 2)):
        weight = getattr(experts, name).detach()
        local, placement = (weight, Replicate()) if whole else (weight.narrow(dim, start, width).clone(), Shard(dim))
        experts.register_parameter(name, nn.Parameter(DTensor.from_local(local, mesh, [placement], run_check=False)))
    if not whole:
        EXPERT_TENSOR_MESH[experts] = mesh

    # the router over this rank's tokens: its weight's gradient is Partial, all-reduced
    distribute_module(moe.gate, mesh, lambda name, module, mesh_: replicate_own_parameters(module, mesh_),
                      input_fn=lambda m, inputs, mesh_: tuple(
                          DTensor.from_local(x, mesh_, [Shard(0)], run_check=False) for x in inputs),
                      output_fn=lambda m, output, mesh_: output.to_local())
    # the layer takes the norm's sequence shard as a local tensor and returns its own rows, as
    # the row-parallel linears of the blocks return theirs
    parallelize_module(moe, mesh, PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Shard(1),),
                                                     use_local_output=True))


def split_shared_expert(shared: nn.Module, mesh: Any) -> None:
    """The shared experts' SwiGLU (a ``zoo.llama.FeedForward`` on the layer's rows) split as a
    dense block's, as Megatron-Core's ``SharedExpertMLP`` (an ``MLP``) is: the rank's rows of its
    sequence shard all-gathered, ``w1``/``w3`` by output columns, ``w2`` by input rows, its
    output reduce-scattered back to the rank's rows."""
    from torch.distributed.tensor.parallel import parallelize_module

    Replicate, Shard, ColwiseParallel, RowwiseParallel, _, PrepareModuleInput, _ = styles()
    hidden = shared.w1.out_features
    if hidden % mesh.size():
        raise UsageError(f"tensor parallel degree {mesh.size()} does not divide the shared experts' hidden "
                         f"size {hidden}")
    parallelize_module(shared, mesh, PrepareModuleInput(input_layouts=(Shard(0),), desired_input_layouts=(Replicate(),),
                                                        use_local_output=False))
    parallelize_module(shared, mesh, {"w1": ColwiseParallel(), "w3": ColwiseParallel(),
                                      "w2": RowwiseParallel(output_layouts=Shard(0))})


def gather_rows(rows: torch.Tensor, mesh: Any) -> torch.Tensor:
    """Every tensor-parallel peer's rows, rank-major (its backward: the reduce-scatter)."""
    from torch.distributed import _functional_collectives as fc

    gather = getattr(fc, "all_gather_single_autograd", None) or fc.all_gather_tensor_autograd  # renamed in 2.13
    return fc.wait_tensor(gather(rows, gather_dim=0, group=mesh.get_group()))


def reduce_scatter_rows(rows: torch.Tensor, mesh: Any) -> torch.Tensor:
    """The experts' partial outputs summed over the tensor-parallel peers, each keeping its own
    rows (its backward: the all-gather)."""
    from torch.distributed import _functional_collectives as fc

    scatter = getattr(fc, "reduce_scatter_single_autograd", None) or fc.reduce_scatter_tensor_autograd
    return fc.wait_tensor(scatter(rows, "sum", scatter_dim=0, group=mesh.get_group()))
