"""The optimizer's arithmetic on tensors without values, skipped: cheap warm-up and steps.

A trace records the steady-state step, so one optimizer step runs first, unrecorded, to
create the state (Adam's moments, SGD's momentum buffers, step counters). On fake tensors
that step's arithmetic is wasted work: a fake tensor holds no values, and an in-place
elementwise op leaves its target's shape, dtype and strides as they were, so skipping it
changes nothing the traced step can see. What must still run: ops that create tensors (the
state itself), ops on constant fakes (PyTorch's host-side step counters, whose values the
optimizer reads with ``.item()`` for its bias corrections), and in-place ops that change
metadata (``resize_``, ``t_``...: tagged ``inplace_view``). For an 8B-parameter AdamW this
saves about a tenth of the whole analysis.

The same holds in the recorded step for the optimizer's in-place foreach ops
(``skipped_foreach``): the recorder records them without running them. Only those: an
in-place op of the model's own code still runs, so a shape it could not write fails as on
the device. On meta tensors (``trace.meta_world``) a foreach op's loop of per-tensor ops is
most of the optimizer's recording time.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten


def _skippable(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """An in-place op whose every tensor is without a value (``_valueless``), that returns
    nothing or its first (mutated) argument."""
    schema = func._schema
    if torch.Tag.inplace_view in func.tags or not schema.is_mutable:
        return False
    returns = schema.returns
    first = schema.arguments[0] if schema.arguments else None
    if first is None or first.alias_info is None or not first.alias_info.is_write:
        return False
    if returns and (len(returns) != 1 or returns[0].alias_info is None
                    or not returns[0].alias_info.is_write):
        return False
    tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
    return bool(tensors) and all(_valueless(t) for t in tensors)


def _valueless(t: torch.Tensor) -> bool:
    """A fake without a constant, or a meta tensor (a fake says its device is the CPU), or a
    wrapper subclass (a DTensor: FSDP2's and tensor parallelism's parameters, their gradients
    and optimizer state) whose inner tensors all are: skipped before the subclass dispatches
    it (a DTensor propagates its sharding for each op before its local shard's op runs)."""
    if is_traceable_wrapper_subclass(t):
        names, _ = t.__tensor_flatten__()
        inner = [x for x in (getattr(t, name) for name in names) if isinstance(x, torch.Tensor)]
        return bool(inner) and all(_valueless(x) for x in inner)
    return t.constant is None if isinstance(t, FakeTensor) else t.device.type == "meta"


def skipped_foreach(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """An in-place foreach op on tensors without values: recorded, not run (docstring)."""
    return func.__name__.startswith("_foreach_") and _skippable(func, args, kwargs)


class _SkipInplaceMath(TorchDispatchMode):
    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if _skippable(func, args, kwargs):
            return args[0] if func._schema.returns else None
        return func(*args, **kwargs)


def skip_inplace_math() -> TorchDispatchMode:
    """A context within which in-place ops on tensors without values are not run."""
    return _SkipInplaceMath()
