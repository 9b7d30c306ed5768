"""Data parallelism applied to a workload: DDP (and ZeRO-1 beside it) or FSDP2 (full shard, or
HSDP over a replicate x shard mesh), with PyTorch's own engines.

On a fake process group (one process tracing one rank) two things DDP does on real tensors
only are done the engine's own way:
- DDP checks that every rank has the same parameter shapes by reading their data; on a fake
  process group every rank is this one, so the check is skipped.
- DDP's C++ all-reduce hook reads its future's value, which a fake collective has none of:
  a Python hook does the same all-reduce (``c10d.allreduce_`` on the bucket, then DDP
  divides by the world size as its default hook does).
- DDP rebuilds its buckets after the first step in the order gradients became ready;
  ``_steady_state_reducer`` computes that order on a warm-up backward and builds the reducer
  with the engine's own bucket assignment (``dist._compute_bucket_assignment_by_size``), so
  the traced step is the steady state a real run reaches from its second step.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from nnperf.errors import UsageError
from nnperf.layout import DDP_BUCKET_BYTES, OPTIMIZER_STATES, Execution
from nnperf.trace.clip import APART_NORM, NORM_GROUPS, ApartNorm
from nnperf.trace.parallel.distributed_optimizer import (
    SHARDED_BUCKETS,
    ShardedBuckets,
    gather_before_forward,
    reduce_scatter_hook,
    shard_buckets,
)
from nnperf.trace.recorder import GraphLabeler, ModuleStack
from nnperf.workload import Workload, default_loss


def apply_data_parallel(workload: Workload, parts: list[nn.Module], execution: Execution, amp: str | None,
                        mesh: Any, units: Any, real: bool = False, tp_mesh: Any = None,
                        experts_mesh: Any = None, expert_mesh: Any = None) -> None:
    """DDP (ZeRO-1: with Megatron-LM's distributed optimizer on it) or FSDP2 over each of
    ``parts`` (a pipeline rank's chunks; the model otherwise), on the data-parallel ``mesh``;
    FSDP2 with ``units(part)`` its blocks. ``real``: a real process group
    (``measure.distributed``), where DDP builds its first-step reducer and rebuilds it as users
    run it, not the steady-state reducer a fake process group needs from the start.
    ``experts_mesh``: under expert parallelism with DDP or ZeRO-1, the experts' data-parallel
    ranks (Megatron-LM's expert-data-parallel group), which their gradients are reduced over in
    buckets of their own (``_ddp``); ``expert_mesh``, the expert group (clipping sums the
    experts' squared norm over it under DDP)."""
    if not execution.replicates_parameters:
        for part in parts:
            fully_shard_blocks(part, mesh, units(part), execution.reshard_after_forward, amp)
        return
    # DDP over the data-parallel group of each (tensor, pipeline) coordinate; alone, that is
    # every rank: the default group, as plain DDP runs
    group = None if execution.data_parallel == execution.world else mesh.get_group()
    experts_group = experts_mesh.get_group() if experts_mesh is not None else None
    sharded: list[ShardedBuckets] = []
    if execution.pipeline > 1:
        rank = workload.model
        for i, chunk in enumerate(list(rank.stages)):
            def ready(chunk: nn.Module = chunk, i: int = i) -> list[int]:
                # the stage's input (the first's: a micro-batch of the samples), a backward from its output
                tokens = rank.pipeline_inputs[0]
                inputs = tokens[:tokens.shape[0] // rank.micro_batches] if chunk.first else rank.shapes[i][0]
                return _gradient_ready_order(chunk, (inputs,), lambda out: out.float().sum())
            rank.stages[i] = _ddp(chunk, ready, execution, group, real, sharded, experts_group)
    else:
        def ready() -> list[int]:
            return _gradient_ready_order(workload.model, workload.inputs, workload.loss_fn or default_loss)
        workload.model = _ddp(workload.model, ready, execution, group, real, sharded, experts_group)
    # gradient clipping's norm: summed over what each rank holds a part of (ZeRO-1's shares,
    # tensor parallelism's shards), as Megatron-LM's all-reduces of the squared norm
    groups = []
    if sharded:
        setattr(workload.model, SHARDED_BUCKETS, sharded)
        groups.append(group if group is not None else dist.group.WORLD)
    if execution.tensor > 1:
        groups.append(tp_mesh.get_group())
    setattr(workload.model, NORM_GROUPS, [*getattr(workload.model, NORM_GROUPS, []), *groups])
    if experts_group is not None and not sharded:
        # DDP: whole dense gradients on every rank, each rank of the expert group its own experts'
        # (ZeRO-1's shares, experts' and others', sum to the whole over the data-parallel group)
        setattr(workload.model, APART_NORM, ApartNorm(_expert_ids(parts if execution.pipeline == 1
                                                                  else list(workload.model.stages)),
                                                      expert_mesh.get_group()))


def forward_dtype(execution: Execution, amp: str | None) -> torch.dtype | None:
    """The dtype the data-parallel engine runs a forward in, its outputs too: FSDP2's
    mixed-precision parameters (``mixed_precision``: gathered in the autocast dtype, the inputs
    cast to it); None where the parameters' own dtype and autocast decide (DDP, ZeRO-1, none)."""
    from nnperf.trace.options import AMP_DTYPES

    sharded = execution.applies_data_engine and not execution.replicates_parameters
    return AMP_DTYPES[amp] if amp and sharded else None


def mixed_precision(amp: str | None) -> Any:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from nnperf.trace.options import AMP_DTYPES

    return MixedPrecisionPolicy(param_dtype=AMP_DTYPES[amp], reduce_dtype=torch.float32) if amp else \
        MixedPrecisionPolicy()


def fully_shard_blocks(model: nn.Module, mesh: Any, blocks: list[str], reshard: bool, amp: str | None = None) -> None:
    """FSDP2 per block, then the root. With mixed precision (``--amp``) the parameters are
    gathered in the compute dtype and gradients reduced in fp32 (``MixedPrecisionPolicy``, as
    torchtitan's ``mixed_precision_param`` / ``mixed_precision_reduce`` defaults do)."""
    from torch.distributed.fsdp import fully_shard

    policy = mixed_precision(amp)
    modules = dict(model.named_modules())
    for name in blocks:
        fully_shard(modules[name], mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
    # torchtitan leaves the root gathered after forward: backward needs it first
    fully_shard(model, mesh=mesh, reshard_after_forward=False if blocks else reshard, mp_policy=policy)


def _ddp(module: nn.Module, ready: Callable[[], list[int]], execution: Execution, group: Any, real: bool,
         sharded: list[ShardedBuckets], experts_group: Any = None) -> nn.Module:
    """``module`` under DDP over ``group``: its tensor-parallel parameters made local first
    (``localize_tensor_parallel``), its buckets those DDP rebuilds after its first step (``ready``:
    the order backward finishes the gradients), on a fake process group built so from the start
    (``_steady_state_reducer``); ZeRO-1 adds Megatron-LM's distributed optimizer
    (``trace.parallel.distributed_optimizer``): its parameters laid out per bucket, the buckets
    reduce-scattered, the parameters all-gathered as the next forward starts.

    ``experts_group``: the experts' weights (expert parallelism) are bucketed apart and reduced
    over that group, as Megatron-LM keeps them in a buffer of their own reduced over its
    expert-data-parallel group; every gradient is divided by the whole data-parallel size (its
    ``expert_gradient_scaling_factor``: an expert's tokens come from every rank of its expert
    group). DDP reduces over one group, so both kinds of bucket go through this module's hook,
    on a real process group too."""
    from torch.nn.parallel import DistributedDataParallel
    from torch.nn.parallel import distributed as ddp_module

    localize_tensor_parallel(module)
    zero1 = execution.shards_optimizer_only
    expert_ids = _expert_ids([module]) if experts_group is not None else frozenset()
    apart = frozenset(i for i, p in enumerate(_trainable(module)) if id(p) in expert_ids)
    if real and zero1 and apart:
        raise UsageError("ZeRO-1 with expert parallelism is traced and planned, not run on GPUs: DDP rebuilds its "
                         "buckets after the first step without the experts' own group; run it with --data ddp")
    # ZeRO-1's parameter layout and the experts' own buckets need the steady-state buckets from the start
    steady = not real or zero1 or bool(apart)
    buckets, limits, first = (_bucket_assignment(module, ready(), execution.bucket_bytes, apart) if steady
                              else ([], [], 0))
    verify = ddp_module._verify_param_shape_across_processes
    if not real:  # every rank of a fake process group is this one: nothing to compare
        ddp_module._verify_param_shape_across_processes = lambda *a, **k: None
    dense = group if group is not None else dist.group.WORLD
    groups = [experts_group if bucket[0] in apart else dense for bucket in buckets]
    shards = (shard_buckets(module, buckets, dense, groups, OPTIMIZER_STATES[execution.optimizer_states],
                            main_grads=execution.grad_reduce_in_fp32) if zero1 else None)
    sync = ddp_module._sync_module_states
    if apart:  # DDP's own first sync would copy rank 0's experts over every rank's
        ddp_module._sync_module_states = lambda *a, **k: None
        if real:
            _sync_apart(module, dense, experts_group, expert_ids)
    try:
        ddp = DistributedDataParallel(module, bucket_cap_mb=execution.bucket_bytes / 2**20, process_group=group,
                                      gradient_as_bucket_view=zero1)
    finally:
        ddp_module._verify_param_shape_across_processes = verify
        ddp_module._sync_module_states = sync
    if steady:
        _steady_state_reducer(ddp, buckets, limits, first, execution.bucket_bytes, zero1)
    if shards is not None:
        ddp.register_comm_hook(shards, reduce_scatter_hook)
        gather_before_forward(ddp, shards)
        sharded.append(shards)
    elif not real or apart:
        ddp.register_comm_hook(BucketGroups(dense, dist.get_world_size(dense), expert_ids, experts_group),
                               _allreduce_hook)
    return ddp


def _expert_ids(parts: list[nn.Module]) -> frozenset[int]:
    """The ids of the experts' weights in ``parts`` (as wrapped: the optimizer's parameters)."""
    from nnperf.zoo.moe import GroupedExperts

    return frozenset(id(p) for part in parts for m in part.modules() if isinstance(m, GroupedExperts)
                     for p in m.parameters())


def _sync_apart(module: nn.Module, group: Any, experts_group: Any, expert_ids: frozenset[int]) -> None:
    """What DDP's first sync does (every rank starts from rank 0's weights), with the experts
    (``expert_ids``) apart: the other parameters and the buffers broadcast over the
    data-parallel group, each rank's experts over the ranks that hold the same ones (its
    expert-data-parallel group)."""
    from torch.distributed.utils import _sync_module_states

    expert_names = {name for name, p in module.named_parameters() if id(p) in expert_ids}
    others = {name for name, _ in module.named_parameters() if name not in expert_names}
    _sync_module_states(module, group, _BROADCAST_BYTES, 0, expert_names)
    _sync_module_states(module, experts_group, _BROADCAST_BYTES, 0, others, broadcast_buffers=False)


#: DDP's bucket for its first broadcast (``DistributedDataParallel.broadcast_bucket_size``).
_BROADCAST_BYTES = 250 * 2**20


def _trainable(module: nn.Module) -> list[nn.Parameter]:
    return [p for p in module.parameters() if p.requires_grad]


def _bucket_assignment(module: nn.Module, order: list[int], bucket_bytes: int,
                       apart: frozenset[int] = frozenset()) -> tuple[list[list[int]], list[int], int]:
    """The buckets DDP rebuilds after its first step (trainable parameters' indices, each
    bucket in gradient-ready order), their size limits and the first bucket's cap: filled in
    ``order``, the first capped at ``dist._DEFAULT_FIRST_BUCKET_BYTES`` when the cap is DDP's
    default (as ``_BucketCapacityConfig`` and the C++ rebuild do). The parameters ``apart``
    (experts') fill buckets of their own, all of the full size (Megatron-LM's expert buffer; no
    first bucket is capped there); the two kinds are interleaved in the order their buckets
    become ready (their last gradient), which DDP's reducer launches them in."""
    params = [p for p in module.parameters() if p.requires_grad]
    first = dist._DEFAULT_FIRST_BUCKET_BYTES if bucket_bytes == DDP_BUCKET_BYTES else bucket_bytes
    limits = [first, bucket_bytes] if first < bucket_bytes else [bucket_bytes]
    position = {i: n for n, i in enumerate(order)}
    assigned: list[tuple[list[int], int]] = []
    for kind, kind_limits in (([i for i in order if i not in apart], limits),
                              ([i for i in order if i in apart], [bucket_bytes])):
        if not kind:
            continue
        found, per_bucket = dist._compute_bucket_assignment_by_size([params[i] for i in kind], kind_limits,
                                                                    [False] * len(kind))
        assigned += [([kind[i] for i in bucket], limit) for bucket, limit in zip(found, per_bucket, strict=True)]
    assigned.sort(key=lambda b: max(position[i] for i in b[0]))
    return [b for b, _ in assigned], [limit for _, limit in assigned], first


def _gradient_ready_order(model: nn.Module, inputs: tuple[Any, ...], loss_fn: Any) -> list[int]:
    """Indices of the trainable parameters in the order backward finishes their gradients
    (what DDP's reducer records in its first step and rebuilds its buckets by)."""
    params = [p for p in model.parameters() if p.requires_grad]
    index = {id(p): i for i, p in enumerate(params)}
    order: list[int] = []
    handles = [p.register_post_accumulate_grad_hook(lambda p: order.append(index[id(p)])) for p in params]
    try:
        # under the tracer's substitutions (fused attention, native dropout), as the traced step
        # and a checkpointed block's recomputation run
        with GraphLabeler(ModuleStack({})):
            output = model(*inputs)
            loss_fn(output).backward()
    finally:
        for h in handles:
            h.remove()
        for p in params:
            p.grad = None
    return list(dict.fromkeys(order)) + [i for i in range(len(params)) if i not in set(order)]


def _steady_state_reducer(ddp: Any, buckets: list[list[int]], limits: list[int], first: int, bucket_bytes: int,
                          as_views: bool) -> None:
    """Replace the first-step reducer (one bucket) by the one DDP rebuilds after step 1
    (``_bucket_assignment``); ``as_views``: the gradients are views of the buckets."""
    params = [p for p in ddp.module.parameters() if p.requires_grad]
    reducer = dist.Reducer(
        params, buckets, limits, ddp.process_group, [False] * len(params), bucket_bytes,
        False, as_views, {}, first, False, False, [], False,
    )
    ddp.reducer = reducer
    ddp.logger = dist.Logger(reducer)
    reducer.set_logger(ddp.logger)


@dataclass(frozen=True)
class BucketGroups:
    """What DDP's hook reduces a bucket's gradients over: the data-parallel ``group``, or for
    the experts' weights (``experts``: their ids) ``experts_group``; every gradient divided by
    ``divisor``, the whole data-parallel size."""

    group: Any
    divisor: int
    experts: frozenset[int] = frozenset()
    experts_group: Any = None


def _allreduce_hook(state: BucketGroups, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's default all-reduce (divided by the data-parallel size, summed over the group),
    completed at once. The experts' buckets are reduced over their own group; a bucket that
    holds both kinds (DDP rebuilds its buckets from the first step's order on a real process
    group, without knowing the kinds) is reduced run by run, each over its group."""
    buffer = bucket.buffer()
    buffer.div_(state.divisor)
    if not state.experts:  # plain DDP: one group
        dist.all_reduce(buffer, group=state.group)
        return _done(buffer)
    start = 0
    for expert, run in itertools.groupby(bucket.parameters(), key=lambda p: id(p) in state.experts):
        size = sum(p.numel() for p in run)
        whole = start == 0 and size == buffer.numel()
        dist.all_reduce(buffer if whole else buffer[start:start + size],
                        group=state.experts_group if expert else state.group)
        start += size
    return _done(buffer)


def _done(buffer: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    """A completed future of the reduced bucket, as DDP's hook returns it."""
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(buffer)
    return future


# DDP checks a hook's annotations as objects (this module's are strings: __future__).
_allreduce_hook.__annotations__.update(state=BucketGroups, bucket=dist.GradBucket,
                                       **{"return": torch.futures.Future[torch.Tensor]})


def localize_tensor_parallel(module: nn.Module) -> None:
    """DDP buckets and reduces plain tensors: each DTensor parameter of ``module`` (tensor
    parallelism's) becomes a parameter holding its local shard, and is made the same DTensor
    again (``DTensor.from_local``, differentiable: its gradient reaches the local parameter) for
    each forward of the module that owns it, shadowing the parameter in the module's
    ``__dict__`` while it runs. What ``torch.distributed.tensor.parallel.ddp.
    _pre_dp_module_transform`` does for TP with DDP, kept across steps (its version drops the
    parameters after the first forward). A replicated parameter whose gradient is partial (a
    sequence-parallel norm's) gets it all-reduced over the tensor-parallel group there, as
    DTensor does."""
    from torch.distributed.tensor import DTensor

    for sub in module.modules():
        owned = {name: p for name, p in sub._parameters.items() if isinstance(p, DTensor)}
        if not owned:
            continue
        specs = {}
        for name, p in owned.items():
            local = nn.Parameter(p._local_tensor, requires_grad=p.requires_grad)
            sub._parameters[name] = local
            specs[name] = (p.device_mesh, p.placements, p.shape, p.stride())

        def to_dtensor(m: nn.Module, args: Any, specs: dict[str, Any] = specs) -> None:
            for name, (mesh, placements, shape, stride) in specs.items():
                m.__dict__[name] = DTensor.from_local(m._parameters[name], mesh, placements, run_check=False,
                                                      shape=shape, stride=stride)

        def to_local(m: nn.Module, args: Any, output: Any, specs: dict[str, Any] = specs) -> None:
            for name in specs:
                m.__dict__.pop(name, None)

        sub.register_forward_pre_hook(to_dtensor)
        sub.register_forward_hook(to_local)
