"""Megatron-LM's column-parallel linears under sequence parallelism: each keeps its own
sequence shard of the input for backward, not the all-gathered input, and gathers it again
in backward for the weight gradient, overlapped with the input-gradient GEMM.

Megatron-LM's ``LinearWithGradAccumulationAndAsyncCommunication`` (megatron/core/
tensor_parallel/layers.py) saves ``input`` — the rank's 1/tp of the sequence — when
``sequence_parallel`` is set; its backward launches ``_all_gather_base`` of it
asynchronously, computes the input gradient (``grad_output @ weight``) while it runs, waits,
then computes the weight gradient from the gathered input. Transformer Engine's
``LayerNormLinear`` does the same with its ``ln_out`` (``ln_out_needs_gather``). One linear
there takes q, k and v (or SwiGLU's two inputs) at once, so a block gathers each input twice
in all: once in forward, once in backward.

With DTensor, the all-gather is ``PrepareModuleInput``'s, and ``aten.mm``'s autograd saves the
gathered input and computes the weight gradient first. Here each column-parallel linear the
gathered input feeds runs as ``_ColumnLinear``, Megatron-LM's function: it saves nothing of
the input but the module's shared record of the shard (``_Shard``); in backward it computes
the input gradient before it reads the gathered input (one all-gather per module call: the
other linears of the block reuse the gathered copy, which lives until the last of them has
run). The comm timeline (``passes.comm_timeline``) overlaps the all-gather with what runs
before that read.

Where the all-gather is issued differs. Megatron-LM issues it when its one q-k-v linear's
backward starts, and the input-gradient GEMM of q, k and v together hides it. The zoo's Llama
has three linears, backpropagated v first, and v's input-gradient GEMM alone (with
grouped-query attention a small fraction of the three) would leave most of it exposed, a
cost of the zoo's split that Megatron-LM does not pay. So it is issued earlier: once backward
has the input gradient of the block's row-parallel linear (``wo``, ``w2``), beside the
attention's (the activation's) backward; the gathered copy lives that much longer.

Not applied under activation checkpointing of whole blocks or torchtitan's selective policies
(``Execution.keeps_sequence_shards``): a checkpointed block saves nothing inside but what its
policy keeps. Megatron-LM's selective recomputation checkpoints the core attention alone
(``search.memory_variants.CORE_ATTENTION``): its linears keep their shards as here. Nor under
autocast, which Megatron-LM does not run (it casts the model: ``--dtype``); there the linears
save what DTensor's save (``search.plan.notes.AUTOCAST_SEQUENCE_PARALLEL``).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class _Shard:
    """A module call's sequence shard, gathered again on the first ``gathered()`` in backward
    and shared by the linears the gathered input fed."""

    def __init__(self, shard: Any, placements: tuple[Any, ...]) -> None:
        self.shard = shard
        self.placements = placements
        self._gathered: Any = None

    def gathered(self) -> Any:
        """The gathered input as (tokens, features), its tokens in the ranks' order (rank, then
        sample, then position), not waited for until first read."""
        if self._gathered is None:
            self._gathered = _gather_sequence(self.shard, self.placements)
        return self._gathered


def _gather_sequence(shard: Any, placements: tuple[Any, ...]) -> Any:
    """The shards (batch, sequence/tp, ...) of the ranks one after the other, as (tokens,
    features), waited for only where first read (the weight gradient). Megatron-LM's
    sequence-first layout gathers the sequence in order; here one sample's tokens are in order
    too, and with more the weight gradient reorders its output gradient to match (``_ColumnLinear``),
    so the all-gather is not waited for at once, as DTensor's along the sequence would be."""
    from torch.distributed._functional_collectives import AsyncCollectiveTensor
    from torch.distributed.tensor import DTensor

    mesh = shard.device_mesh
    local = shard.to_local()
    group = mesh.get_group()
    # the functional collective's own wrapper waits at once while tracing (fake tensors); the
    # one it returns on real tensors, this one, waits when its result is first read
    gathered = AsyncCollectiveTensor(torch.ops._c10d_functional.all_gather_into_tensor(
        local.contiguous(), group.size(), group.group_name))
    return DTensor.from_local(gathered.view(-1, local.shape[-1]), mesh, placements, run_check=False)


def _in_rank_order(grad: Any, ranks: int) -> Any:
    """The output gradient (batch, sequence, features) as (tokens, features) in the gathered
    input's order: a copy where the batch holds more than one sample."""
    batch, sequence, features = grad.shape[0], grad.shape[1], grad.shape[-1]
    if batch == 1:
        return grad.reshape(-1, features)
    return grad.reshape(batch, ranks, sequence // ranks, features).transpose(0, 1).reshape(-1, features)


class _ColumnLinear(torch.autograd.Function):
    """A column-parallel linear of the gathered input, as Megatron-LM's: backward gathers the
    shard (issued first), computes the input gradient, then the weight gradient."""

    @staticmethod
    def forward(ctx: Any, x: Any, weight: Any, bias: Any, shard: _Shard) -> Any:
        ctx.shard = shard
        ctx.has_bias = bias is not None
        ctx.save_for_backward(weight)
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        (weight,) = ctx.saved_tensors
        gathered = ctx.shard.gathered()  # issued before the GEMM it overlaps
        grad_input = grad @ weight if ctx.needs_input_grad[0] else None
        grad_tokens = _in_rank_order(grad, ctx.shard.shard.device_mesh.size())
        grad_weight = grad_tokens.t() @ gathered
        grad_bias = grad_tokens.sum(0) if ctx.has_bias else None
        return grad_input, grad_weight, grad_bias, None


class _ShardKeeper:
    """The hooks of one module: the shard before its input is gathered, the gathered input
    after, both forgotten when its forward ends."""

    def __init__(self) -> None:
        self._shard: Any = None
        self.current: _Shard | None = None
        self._storage: Any = None

    def before_gather(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        self._shard = args[0]

    def after_gather(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        from torch.distributed.tensor import DTensor

        gathered, shard = args[0], self._shard
        self._shard = None
        if (torch.is_grad_enabled() and isinstance(gathered, DTensor) and isinstance(shard, DTensor)
                and not torch.is_autocast_enabled(gathered.device.type)):  # see _column_forward
            self.current = _Shard(shard, tuple(gathered.placements))
            self._storage = _storage_of(gathered)

    def after_forward(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        self.current = self._storage = None

    def shard_of(self, x: Any) -> _Shard | None:
        """The module call's shard where ``x`` is its gathered input."""
        if self.current is None or not hasattr(x, "device_mesh") or _storage_of(x) != self._storage:
            return None
        return self.current


def _storage_of(tensor: Any) -> Any:
    """The identity of a DTensor's local storage (a view shares its base's), held weakly so it
    keeps nothing alive. Read off the wrapper (``_local_tensor``), not through ``to_local()``:
    that is an op of its own, which the trace would record and time as the step's work."""
    from torch.multiprocessing.reductions import StorageWeakRef

    return StorageWeakRef(tensor._local_tensor.untyped_storage())


def _column_forward(linear: nn.Linear, keeper: _ShardKeeper, x: Any) -> Any:
    """Megatron-LM's function for the gathered input. Not under autocast (the keeper then records
    no shard): Megatron-LM casts the model instead, and the function would have to keep
    autocast's weight casts."""
    shard = keeper.shard_of(x)
    if shard is None:
        return F.linear(x, linear.weight, linear.bias)
    from nnperf.trace.recorder import label_nodes

    out = _ColumnLinear.apply(x, linear.weight, linear.bias, shard)
    label_nodes(out)  # its backward is this linear's (FP8 GEMMs are found by module)
    return out


def _row_forward(linear: nn.Linear, keeper: _ShardKeeper, x: Any) -> Any:
    """A row-parallel linear of the block: once backward has its input gradient, the block's
    shard is gathered again (see ``keep_sequence_shards``)."""
    shard = keeper.current
    if shard is not None and x.requires_grad:
        x.register_hook(partial(_prefetch, shard))
    return F.linear(x, linear.weight, linear.bias)


def _prefetch(shard: _Shard, grad: Any) -> None:
    shard.gathered()


def keep_sequence_shards(module: nn.Module) -> None:
    """Make the column-parallel linears inside ``module`` (whose first input
    ``parallelize_module`` all-gathers over the sequence) Megatron-LM's: they keep the sequence
    shard for backward in place of the gathered input."""
    from torch.distributed.tensor import DTensor, Shard

    keeper = _ShardKeeper()
    module.register_forward_pre_hook(keeper.before_gather, prepend=True)
    module.register_forward_pre_hook(keeper.after_gather)
    module.register_forward_hook(keeper.after_forward, always_call=True)
    for linear in module.modules():
        weight = getattr(linear, "weight", None)
        if isinstance(linear, nn.Linear) and isinstance(weight, DTensor):
            if weight.placements == (Shard(0),):
                linear.forward = partial(_column_forward, linear, keeper)
            elif weight.placements == (Shard(1),):
                linear.forward = partial(_row_forward, linear, keeper)
