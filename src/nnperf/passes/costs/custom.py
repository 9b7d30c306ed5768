"""Cost formulas for a user's own operators (``torch.library.custom_op``, C++ extensions).

A trace records such an op as one event like any aten op; with no formula it is reported
as uncovered. ``register_cost`` gives it one, in the same form as nnperf's own formulas
(an ``OpEvent`` in, an ``OpCost`` out), the way ``torch.utils.flop_counter.FlopCounterMode``
takes a ``custom_mapping``. The registration is process-wide rather than an argument of
``analyze`` so that it reaches every command that traces (``predict``, ``memory``, ``fit``,
whose searches run in forked workers) and the CLI: a model file given as
``file.py:factory`` can register the costs of the ops it defines when it is imported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from nnperf.passes.costs.registry import CUSTOM_FORMULAS, Formula, OpCost, resolve_op
from nnperf.trace.events import OpEvent, op_name
from nnperf.vocab import Category

#: What a custom op's formula may return. Not gemm or conv: the time model times those from
#: the GEMM shapes of aten's matrix products, which a custom op does not have, so its kernel
#: would come out as zero seconds.
_ALLOWED = tuple(c for c in Category if c not in (Category.GEMM, Category.CONV, Category.UNCOVERED))

def register_cost(op: Any, formula: Formula | None = None) -> Any:
    """Count ``op`` with ``formula`` from now on in this process; usable as a decorator.

    ``op``: ``torch.ops.mylib.my_op`` (every overload), ``torch.ops.mylib.my_op.default``
    or what ``torch.library.custom_op`` returned (that overload only), or its name as reports print it (``"mylib.my_op"``,
    ``"mylib::my_op"``). ``formula(event)`` gets the op's ``OpEvent``: ``args``/``kwargs``
    with every tensor replaced by a ``TensorMeta`` (``shape``, ``dtype``, ``numel``,
    ``nbytes``), ``inputs``, ``outputs``, ``phase``, ``module``. It returns an ``OpCost``:
    the ``Category`` that decides how the op is timed (``ATTENTION``: FLOPs at the tensor
    cores' rate; ``ELEMENTWISE``, ``REDUCTION``, ``NORM``, ``MEMORY``: bytes at memory
    bandwidth or FLOPs at the CUDA cores' rate, whichever is longer), ``flops`` (2 per
    multiply-accumulate), ``macs``, and the tensors the kernel ``reads`` and ``writes``
    (usually ``event.inputs`` and ``event.outputs``). A later registration of the same op
    replaces the earlier one; a user's formula takes precedence over nnperf's own.
    """
    key = _op_key(op)

    def wrap(fn: Formula) -> Formula:
        if not callable(fn):
            raise TypeError(f"register_cost({key!r}): the formula must be callable, got {fn!r}")
        CUSTOM_FORMULAS[key] = _checked(key, fn)
        return fn

    return wrap if formula is None else wrap(formula)


def _op_key(op: Any) -> str:
    """``ns.op`` for an overload packet or a name without overload, ``ns.op.overload`` for an
    overload; a clear error for anything torch does not know as an operator."""
    if isinstance(op, str):
        if resolve_op(op) is None:
            raise ValueError(
                f"register_cost: torch has no operator {op!r}; define it first "
                "(torch.library.custom_op or a C++ extension) and import the module that does"
            )
        return op.replace("::", ".", 1)
    op = getattr(op, "_opoverload", op)  # what torch.library.custom_op returns: its overload
    if isinstance(op, torch._ops.OpOverload):
        return f"{op_name(op)}.{op._overloadname}"
    if isinstance(op, torch._ops.OpOverloadPacket):
        return op._qualified_op_name.replace("::", ".", 1)
    raise TypeError(
        f"register_cost: expected an operator such as torch.ops.mylib.my_op, its overload "
        f"torch.ops.mylib.my_op.default or its name 'mylib.my_op', got {op!r}"
    )


def _checked(key: str, fn: Formula) -> Callable[[OpEvent], OpCost]:
    """Wrap a user's formula so that a wrong return value fails with the op's name instead of
    being timed as zero further down."""

    def formula(event: OpEvent) -> OpCost:
        cost = fn(event)
        if not isinstance(cost, OpCost):
            raise TypeError(
                f"the cost formula registered for {key} returned {cost!r}; it must return "
                "nnperf.OpCost(category, flops=..., reads=..., writes=...)"
            )
        category = Category(cost.category) if cost.category in _ALLOWED else None
        if category is None:
            raise ValueError(
                f"the cost formula registered for {key} returned category {cost.category!r}; "
                f"a custom op's can be {', '.join(_ALLOWED)} (gemm and conv are timed from "
                "aten's GEMM shapes: use attention for tensor-core math)"
            )
        return replace(cost, category=category)

    return formula
