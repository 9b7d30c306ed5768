"""What the engines need to run on fake tensors in one process, each the engine's own code path.

- DTensor learns its outputs' shapes by running ops on placeholders; they are not recorded, and
  its sharding decisions are memoized per process group (``engines_on_fake_tensors``).
- FSDP2 joins a tensor-parallel mesh to its own by reading the rank table with real tensor ops:
  run outside the fake mode, as in a real process.
- FSDP2 frees and regathers parameters by resizing storages, which the recorder is told of.
- FSDP2's all-gather bypasses selective checkpointing's op cache, as PyTorch does from
  pytorch/pytorch#196862.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch

from nnperf.trace.fake_world import sharding_propagator
from nnperf.trace.recorder import outside_block_calls, unrecorded


@contextlib.contextmanager
def engines_on_fake_tensors(memo: dict[Any, Any]) -> Iterator[None]:
    """DTensor learns its outputs' shapes by running the op on placeholder tensors; those
    are not kernels any GPU runs, so they are not recorded. FSDP2 over tensor-parallel
    parameters joins the two meshes (``DeviceMesh._concatenate``), reading the rank table with
    real tensor ops: run outside the fake mode, as in a real process."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    original = ShardingPropagator._propagate_tensor_meta_non_cached
    concatenate = DeviceMesh.__dict__["_concatenate"]

    @functools.wraps(original)
    def quiet(self: Any, *args: Any, **kwargs: Any) -> Any:
        with unrecorded():
            return original(self, *args, **kwargs)

    def real_concatenate(meshes: list[Any]) -> Any:
        with unset_fake_temporarily(), unrecorded():
            return concatenate.__func__(meshes)

    ShardingPropagator._propagate_tensor_meta_non_cached = quiet
    DeviceMesh._concatenate = staticmethod(real_concatenate)
    propagator = sharding_propagator()
    uncached = propagator.propagate_op_sharding_non_cached

    def memoized(op_schema: Any) -> Any:
        # Under a fake mode DTensor skips its sharding cache (it assumes a compiler traces
        # symbolic shapes); a trace's shapes are concrete, so a decision is reused as a real
        # run's cache reuses it (for this process group only: the cache is per rank); a foreach
        # op's from its elements' (``foreach_by_element``)
        try:
            return memo[op_schema]
        except KeyError:
            result = foreach_by_element(op_schema, memoized)
            result = memo[op_schema] = uncached(op_schema) if result is None else result
            return result
        except TypeError:  # an unhashable schema
            return uncached(op_schema)

    propagator.propagate_op_sharding_non_cached = memoized
    try:
        with _follow_fsdp_storage(), fsdp_gathers_outside_selective_checkpointing(), _fsdp_hooks_outside_blocks():
            yield
    finally:
        ShardingPropagator._propagate_tensor_meta_non_cached = original
        DeviceMesh._concatenate = concatenate
        del propagator.propagate_op_sharding_non_cached


def foreach_by_element(op_schema: Any, decide: Any) -> Any:
    """The sharding decision of a foreach op (an optimizer's ``_foreach_mul_`` over every
    parameter) from ``decide`` of each element's one-element op, or None where that does not
    give the whole decision (a redistribution, keyword arguments, lists of unequal length).

    DTensor decides a foreach op element by element (``expanded_foreach_strategy``), but over
    the whole list at once, so a step's optimizer over hundreds of parameters of a dozen shapes
    is decided anew for every list, every depth and every layout; one element's decision
    (``decide``: memoized) is the same wherever that element recurs: a stack's blocks hold the
    same parameters. Each element's decision is DTensor's own on the one-element list."""
    from torch.distributed.tensor._dtensor_spec import DTensorSpec
    from torch.distributed.tensor._op_schema import OpSchema, OutputSharding

    if not str(op_schema.op).startswith("aten._foreach_") or op_schema.kwargs_schema:
        return None
    args = op_schema.args_schema
    lists = [a for a in args if isinstance(a, (list, tuple))]
    if not lists or not isinstance(args[0], (list, tuple)) or not all(isinstance(x, DTensorSpec) for x in args[0]):
        return None
    count = len(args[0])
    if count < 2 or any(len(a) != count for a in lists):
        return None
    outputs = []
    for i in range(count):
        element = OpSchema(op_schema.op, tuple([a[i]] if isinstance(a, (list, tuple)) else a for a in args),
                           {}, schema_info=op_schema.schema_info)
        decision = decide(element)
        if decision.needs_redistribute or decision.redistribute_schema is not None:
            return None
        outputs.append(decision.output_spec)
    if all(o is None for o in outputs):  # in place: no output
        return OutputSharding(None)
    if not all(isinstance(o, (list, tuple)) and len(o) == 1 for o in outputs):
        return None
    return OutputSharding(type(outputs[0])(o[0] for o in outputs))


@contextlib.contextmanager
def _follow_fsdp_storage() -> Iterator[None]:
    """FSDP2 frees a gathered parameter by resizing its storage to 0 bytes and gathers into it
    again later (``_fsdp_param.free_storage`` / ``alloc_storage``); a storage resize is no op
    the recorder sees, so the recorder is told, and the memory pass sees each gathered copy
    live only between its all-gather and its reshard, as on the GPU."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    from nnperf.trace.recorder import OpRecorder

    def recorder() -> OpRecorder | None:
        return next((m for m in _get_current_dispatch_mode_stack() if isinstance(m, OpRecorder)), None)

    alloc, free = _fsdp_param.alloc_storage, _fsdp_param.free_storage

    def alloc_storage(tensor: torch.Tensor) -> None:
        resized = tensor.untyped_storage().size() != tensor.numel() * tensor.itemsize
        alloc(tensor)
        if resized and (r := recorder()) is not None:
            r.storage_allocated(tensor)

    def free_storage(tensor: torch.Tensor) -> None:
        if tensor.untyped_storage().size() != 0 and (r := recorder()) is not None:
            r.storage_freed(tensor)
        free(tensor)

    _fsdp_param.alloc_storage = _fsdp_param_group.alloc_storage = alloc_storage
    _fsdp_param.free_storage = free_storage
    try:
        yield
    finally:
        _fsdp_param.alloc_storage = _fsdp_param_group.alloc_storage = alloc
        _fsdp_param.free_storage = free


@contextlib.contextmanager
def _fsdp_hooks_outside_blocks() -> Iterator[None]:
    """FSDP2's backward hooks run eagerly around a compiled block's backward, inside the block's
    own autograd nodes: the unshard before it in the pre-hook of the block's output
    (``FSDPState._pre_backward``), the reduction after it in the node its pre-forward made
    (``FSDPParamGroup.post_backward``, through ``RegisterPostBackwardFunction``). Their ops are
    no block call's (``recorder.outside_block_calls``), as its pre-forward's are not."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group, _fsdp_state

    state, group = _fsdp_state.FSDPState, _fsdp_param_group.FSDPParamGroup
    pre, post = state.__dict__["_pre_backward"], group.__dict__["post_backward"]

    def outside(hook: Any) -> Any:
        @functools.wraps(hook)
        def call(*args: Any, **kwargs: Any) -> Any:
            with outside_block_calls():
                return hook(*args, **kwargs)
        return call

    state._pre_backward, group.post_backward = outside(pre), outside(post)
    try:
        yield
    finally:
        state._pre_backward, group.post_backward = pre, post


_IN_FSDP_GATHER = [0]


@contextlib.contextmanager
def fsdp_gathers_outside_selective_checkpointing() -> Iterator[None]:
    """FSDP2's all-gather launch and copy-out bypass selective checkpointing's op caching, as
    PyTorch does from pytorch/pytorch#196862 ("[FSDP] Exclude all-gather internals from
    selective checkpointing"): a unit FSDP shards inside a checkpointed block (an MoE layer's
    experts) may be gathered once in forward (prefetched, outside the block) and again inside
    the recomputation, and torch 2.13's selective checkpointing would stop at the unmatched
    ``fsdp.all_gather_copy_in``. Profiler annotations (FSDP's ``record_function`` ranges) are
    passed through too, as in that fix."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group
    from torch.utils import checkpoint

    modes = (checkpoint._CachingTorchDispatchMode, checkpoint._CachedTorchDispatchMode)
    originals = {mode: mode.__dict__["__torch_dispatch__"] for mode in modes}
    gather, copy_out = _fsdp_param_group.foreach_all_gather, _fsdp_param_group.foreach_all_gather_copy_out

    def passing(original: Any) -> Any:
        def dispatch(self: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if _IN_FSDP_GATHER[0] or getattr(func, "namespace", "") == "profiler":  # annotations: the fix's too
                return func(*args, **(kwargs or {}))
            return original(self, func, types, args, kwargs)
        return dispatch

    def bypassing(fn: Any) -> Any:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            _IN_FSDP_GATHER[0] += 1
            try:
                return fn(*args, **kwargs)
            finally:
                _IN_FSDP_GATHER[0] -= 1
        return call

    for mode in modes:
        mode.__torch_dispatch__ = passing(originals[mode])
    _fsdp_param_group.foreach_all_gather = bypassing(gather)
    _fsdp_param_group.foreach_all_gather_copy_out = bypassing(copy_out)
    try:
        yield
    finally:
        for mode in modes:
            mode.__torch_dispatch__ = originals[mode]
        _fsdp_param_group.foreach_all_gather, _fsdp_param_group.foreach_all_gather_copy_out = gather, copy_out
