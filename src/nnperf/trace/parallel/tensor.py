"""Tensor (and sequence) parallelism applied with PyTorch's own ``parallelize_module``, with the
plan each model declares (its ``tensor_parallel_plan()``: the zoo's llama, gpt2 and bert, in
their own modules), and the checks of a degree against the sizes the plan splits.

Megatron-LM's split (Shoeybi et al. 2019, "Megatron-LM", section 3): inside a block the
first linear of attention (q, k, v) and of the MLP is split by output columns
(``ColwiseParallel``), the second by input rows (``RowwiseParallel``), so each block costs one
all-reduce in forward and one in backward per sub-layer. Sequence parallelism (Korthikanti et
al. 2022, "Reducing Activation Recomputation in Large Transformer Models", section 4.2.2)
splits the norms, dropouts and residuals along the sequence: the all-reduce becomes a
reduce-scatter after the row-parallel linear and an all-gather before the column-parallel one
(``SequenceParallel`` + ``PrepareModuleInput``). The zoo's plans are torchtitan's for Llama
(torchtitan/models/llama3/infra/parallelize.py, ``apply_tp``), written for the zoo's GPT-2
and BERT module names the same way; embeddings are split by vocabulary rows
(``RowwiseParallel`` on ``nn.Embedding``) and the output projection by vocabulary columns,
its logits gathered (``Replicate``) for the loss.

What differs from Megatron and is the engine's real behaviour here: GPT-2's packed ``c_attn``
is split in contiguous column blocks (Megatron interleaves q/k/v per head so a shard holds
whole heads; shapes and costs are the same); tied embedding/output weights stay one
``Shard(0)`` parameter (re-tied after splitting); GPT-2's learned positions are sliced to the
rank's sequence shard under sequence parallelism (no communication in forward, an
all-gather of their gradient in backward); BERT's pooler and pre-training heads gather the
sequence first.
"""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from nnperf.errors import UsageError


@dataclass(frozen=True)
class TensorParallelPlan:
    """A model's tensor-parallel plan, declared with the model (its ``tensor_parallel_plan()``):
    ``apply(model, mesh, sequence_parallel, loss_parallel)`` splits it; ``divisible(config)``:
    the sizes the degree must divide, by name."""

    name: str
    apply: Callable[[nn.Module, Any, bool, bool], None]
    divisible: Callable[[dict[str, Any]], dict[str, int]]
    loss_parallel: bool = True  # its output projection can stay split over the vocabulary


def styles() -> Any:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
    )

    return (Replicate, Shard, ColwiseParallel, RowwiseParallel, SequenceParallel,
            PrepareModuleInput, PrepareModuleOutput)


#: The modules whose first input a ``gather_input()`` style all-gathers over the sequence
#: (the column-parallel linears of a block behind them): where Megatron-LM's layouts keep only
#: the sequence shard for backward (``sequence_shards.keep_sequence_shards``).
SEQUENCE_GATHERS: weakref.WeakSet[nn.Module] = weakref.WeakSet()


def gather_input(n_inputs: int = 1, local: bool = False) -> Any:
    """Sequence-sharded input -> replicated (the all-gather before a column-parallel linear)."""
    Replicate, Shard, *_ = styles()
    rest = (None,) * (n_inputs - 1)
    return _sequence_gather()(input_layouts=(Shard(1), *rest), desired_input_layouts=(Replicate(), *rest),
                              use_local_output=local)


@functools.cache
def _sequence_gather() -> type:
    """``PrepareModuleInput`` that also records its module in ``SEQUENCE_GATHERS`` (made once:
    ``torch.distributed`` is imported only when tensor parallelism is applied)."""
    *_, PrepareModuleInput, _ = styles()

    class SequenceGather(PrepareModuleInput):
        def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
            applied = super()._apply(module, device_mesh)
            if not self.use_local_output:  # a block's linears, not a head's local inputs
                SEQUENCE_GATHERS.add(module)
            return applied

    return SequenceGather


def shard_start(length: int, mesh: Any) -> int:
    """Where this rank's slice of a dimension of ``length`` starts under ``Shard`` on the 1-D
    ``mesh``: DTensor splits as ``torch.chunk`` does, ceil(length / n) per rank, the last ones
    fewer (Megatron-Core's vocabulary slices, ``vocab_parallel_loss``, ``vocab_parallel_embedding``)."""
    per_rank = -(-length // mesh.size())
    return min(mesh.get_local_rank() * per_rank, length)


def logits_layout(loss_parallel: bool) -> dict[str, Any]:
    """The output projection's result: split over the vocabulary for a loss-parallel cross
    entropy (``loss_parallel()``, torchtitan's default), else gathered."""
    Replicate, Shard, *_ = styles()
    if loss_parallel:
        return {"output_layouts": Shard(-1), "use_local_output": False}
    return {"output_layouts": Replicate()}


def plan_of(model: nn.Module) -> TensorParallelPlan:
    """The plan ``model`` declares (a ``tensor_parallel_plan()`` method, which may refuse with
    the reason it has none), or one line saying it has none."""
    declared = getattr(model, "tensor_parallel_plan", None)
    if declared is None:
        raise UsageError(f"tensor parallelism needs a plan for {type(model).__name__}; plans exist for "
                         "the built-in gpt2, llama and bert families")
    return declared()


def check_divisible(model: nn.Module, config: dict[str, Any], tensor: int, sequence_parallel: bool,
                    seq_len: int | None) -> None:
    """One line naming the first size ``tensor`` does not divide and the nearest TP degrees that
    divide them all."""
    sizes = dict(plan_of(model).divisible(config))
    if sequence_parallel and seq_len:
        sizes["sequence length (sequence parallel)"] = seq_len
    bad = [(name, value) for name, value in sizes.items() if value % tensor]
    if not bad:
        return
    common = math.gcd(*sizes.values())
    valid = [d for d in range(1, common + 1) if common % d == 0]
    below = max((d for d in valid if d < tensor), default=None)
    above = min((d for d in valid if d > tensor), default=None)
    nearest = " or ".join(str(d) for d in (below, above) if d is not None)
    name, value = bad[0]
    raise UsageError(f"tensor parallel degree {tensor} does not divide {name} = {value} "
                     f"({', '.join(sizes)} must all be divisible); nearest valid degrees: {nearest}")


def valid_degrees(model: nn.Module, config: dict[str, Any], sequence_parallel: bool,
                  seq_len: int | None, limit: int) -> list[int]:
    """Tensor-parallel degrees up to ``limit`` that divide every size the plan splits."""
    sizes = dict(plan_of(model).divisible(config))
    if sequence_parallel and seq_len:
        sizes["seq"] = seq_len
    common = math.gcd(*sizes.values())
    return [d for d in range(1, limit + 1) if common % d == 0]


def uses_loss_parallel(model: nn.Module, wanted: bool) -> bool:
    return wanted and plan_of(model).loss_parallel


def apply_tensor_parallel(model: nn.Module, mesh: Any, sequence_parallel: bool, loss_parallel: bool = False,
                          keep_shards: bool = False) -> bool:
    """Split ``model`` over the 1-D tensor-parallel ``mesh`` with its family's plan, then
    replicate every parameter the plan left alone (``replicate_rest``). ``loss_parallel``: keep
    the logits split over the vocabulary (the loss and its backward must then run under
    ``torch.distributed.tensor.parallel.loss_parallel()``); returns whether it does.
    ``keep_shards``: the blocks' column-parallel linears save their sequence shard for backward
    and gather it again there, as Megatron-LM's do (``sequence_shards``), not the gathered input
    DTensor's autograd keeps."""
    plan = plan_of(model)
    loss_parallel = uses_loss_parallel(model, loss_parallel)
    plan.apply(model, mesh, sequence_parallel, loss_parallel)
    replicate_rest(model, mesh)
    if sequence_parallel and keep_shards:
        from nnperf.trace.parallel.sequence_shards import keep_sequence_shards

        for module in model.modules():
            if module in SEQUENCE_GATHERS:
                keep_sequence_shards(module)
    return loss_parallel


def replicate_rest(model: nn.Module, mesh: Any) -> None:
    """Make each parameter the plan did not split a ``Replicate`` DTensor on the tensor mesh, its
    module taking and returning local tensors. Why: the foreach optimizers refuse a parameter
    group mixing DTensors and plain tensors; with every parameter a DTensor the optimizer's
    steps are the engine's own, and a replicated norm fed sequence shards gets its gradient
    all-reduced exactly as DTensor does it (a ``Partial`` gradient)."""
    from torch.distributed.tensor import DTensor, Replicate, distribute_module

    def to_dtensor(module: nn.Module, inputs: Any, mesh_: Any) -> Any:
        return tuple(DTensor.from_local(x, mesh_, [Replicate()], run_check=False)
                     if isinstance(x, torch.Tensor) and not isinstance(x, DTensor) else x for x in inputs)

    def to_local(module: nn.Module, output: Any, mesh_: Any) -> Any:
        if isinstance(output, DTensor):
            return output.to_local()
        if isinstance(output, tuple):
            return tuple(o.to_local() if isinstance(o, DTensor) else o for o in output)
        return output

    for module in list(model.modules()):
        own = [p for p in module.parameters(recurse=False) if not isinstance(p, DTensor)]
        if own:
            distribute_module(module, mesh,
                              lambda n, m, d, module=module: replicate_own_parameters(m, d) if m is module else None,
                              to_dtensor, to_local)


def replicate_own_parameters(module: nn.Module, mesh: Any) -> None:
    """Each of ``module``'s own parameters not yet a DTensor made a ``Replicate`` one on ``mesh``
    (every rank starts from the same values: a real run broadcasts them)."""
    from torch.distributed.tensor import DTensor, Replicate, distribute_tensor

    for key, param in list(module._parameters.items()):
        if param is not None and not isinstance(param, DTensor):
            module._parameters[key] = nn.Parameter(distribute_tensor(param, mesh, [Replicate()]),
                                                   requires_grad=param.requires_grad)
