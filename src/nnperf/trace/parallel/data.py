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

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from nnperf.layout import DDP_BUCKET_BYTES, Execution
from nnperf.trace.recorder import GraphLabeler, ModuleStack
from nnperf.trace.step import SHARDS_OPTIMIZER
from nnperf.workload import Workload, default_loss


def apply_data_parallel(workload: Workload, parts: list[nn.Module], execution: Execution, amp: str | None,
                        mesh: Any, units: Any, real: bool = False) -> None:
    """DDP over the whole (rank's) model, or FSDP2 over each of ``parts`` (a pipeline rank's
    chunks; the model otherwise) with ``units(part)`` its blocks; ``real``: a real process group
    (``measure.distributed``), where DDP runs as users run it, not with the fake process
    group's steady-state reducer and hook."""
    if execution.replicates_parameters:
        if real:
            from torch.nn.parallel import DistributedDataParallel

            workload.model = DistributedDataParallel(workload.model, bucket_cap_mb=execution.bucket_bytes / 2**20)
        else:
            workload.model = _ddp(workload, execution)
        # ZeRO-1: each rank updates the optimizer state of its share of the parameters and
        # broadcasts them (torch.distributed.optim.ZeroRedundancyOptimizer, made by make_optimizer)
        setattr(workload.model, SHARDS_OPTIMIZER, execution.shards_optimizer_only)
        return
    for part in parts:
        fully_shard_blocks(part, mesh, units(part), execution.reshard_after_forward, amp)


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


def _ddp(workload: Workload, execution: Execution) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel
    from torch.nn.parallel import distributed as ddp_module

    order = _gradient_ready_order(workload)
    verify = ddp_module._verify_param_shape_across_processes
    ddp_module._verify_param_shape_across_processes = lambda *a, **k: None
    try:
        ddp = DistributedDataParallel(workload.model, bucket_cap_mb=execution.bucket_bytes / 2**20)
    finally:
        ddp_module._verify_param_shape_across_processes = verify
    _steady_state_reducer(ddp, order, execution.bucket_bytes)
    ddp.register_comm_hook(None, _allreduce_hook)
    return ddp


def _gradient_ready_order(workload: Workload) -> list[int]:
    """Indices of the trainable parameters in the order backward finishes their gradients
    (what DDP's reducer records in its first step and rebuilds its buckets by)."""
    params = [p for p in workload.model.parameters() if p.requires_grad]
    index = {id(p): i for i, p in enumerate(params)}
    order: list[int] = []
    handles = [p.register_post_accumulate_grad_hook(lambda p: order.append(index[id(p)])) for p in params]
    try:
        # under the tracer's substitutions (fused attention, native dropout), as the traced step
        # and a checkpointed block's recomputation run
        with GraphLabeler(ModuleStack({})):
            output = workload.model(*workload.inputs)
            (workload.loss_fn or default_loss)(output).backward()
    finally:
        for h in handles:
            h.remove()
        for p in params:
            p.grad = None
    return list(dict.fromkeys(order)) + [i for i in range(len(params)) if i not in set(order)]


def _steady_state_reducer(ddp: Any, order: list[int], bucket_bytes: int) -> None:
    """Replace the first-step reducer (one bucket) by the one DDP rebuilds after step 1:
    buckets filled in gradient-ready order, the first capped at ``dist._DEFAULT_FIRST_BUCKET_BYTES``
    when the cap is DDP's default (as ``_BucketCapacityConfig`` and the C++ rebuild do)."""
    params = [p for p in ddp.module.parameters() if p.requires_grad]
    first = dist._DEFAULT_FIRST_BUCKET_BYTES if bucket_bytes == DDP_BUCKET_BYTES else bucket_bytes
    ordered = [params[i] for i in order]
    limits = [first, bucket_bytes] if first < bucket_bytes else [bucket_bytes]
    buckets, per_bucket = dist._compute_bucket_assignment_by_size(ordered, limits, [False] * len(ordered))
    buckets = [[order[i] for i in bucket] for bucket in buckets]
    reducer = dist.Reducer(
        params, buckets, per_bucket, ddp.process_group, [False] * len(params), bucket_bytes,
        False, False, {}, first, False, False, [], False,
    )
    ddp.reducer = reducer
    ddp.logger = dist.Logger(reducer)
    reducer.set_logger(ddp.logger)


def _allreduce_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's default all-reduce (sum over the group, divided by its size), completed at once."""
    buffer = bucket.buffer()
    buffer.div_(dist.get_world_size())
    dist.all_reduce(buffer)
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(buffer)
    return future


# DDP checks a hook's annotations as objects (this module's are strings: __future__).
_allreduce_hook.__annotations__.update(bucket=dist.GradBucket, return_=None)
_allreduce_hook.__annotations__["return"] = torch.futures.Future[torch.Tensor]
del _allreduce_hook.__annotations__["return_"]
