"""The registry of per-op cost formulas, modelled on ``torch.utils.flop_counter``.

A formula takes one ``OpEvent`` and returns an ``OpCost``: FLOPs (2 per multiply-accumulate),
MACs where the op is made of them, and the tensors it must read and write at minimum. The
counting pass splits those bytes into inputs, weights and outputs, so formulas stay short.
Ops with no formula are reported as uncovered; they are never silently zero.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from nnperf.trace.events import OpEvent, TensorMeta
from nnperf.vocab import Category

# The names formula modules and the time model import; aliases of the enum members.
GEMM = Category.GEMM
CONV = Category.CONV
ATTENTION = Category.ATTENTION
ELEMENTWISE = Category.ELEMENTWISE
REDUCTION = Category.REDUCTION
NORM = Category.NORM
MEMORY = Category.MEMORY
OPTIMIZER = Category.OPTIMIZER
ALLOC = Category.ALLOC
HOST = Category.HOST
COMMUNICATION = Category.COMMUNICATION
UNCOVERED = Category.UNCOVERED


@dataclass(frozen=True, slots=True)
class OpCost:
    """What an op costs at minimum. ``reads``/``writes`` are counted once per distinct view."""

    category: Category
    flops: float = 0.0
    macs: float = 0.0
    reads: Sequence[TensorMeta] = ()
    writes: Sequence[TensorMeta] = ()
    extra_read_bytes: float = 0.0  # traffic not tied to one tensor (e.g. a broadcast mask)
    extra_write_bytes: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)


Formula = Callable[[OpEvent], OpCost]
_FORMULAS: dict[str, Formula] = {}
#: Formulas users registered (``nnperf.register_cost``), by ``ns.op`` (every overload) or
#: ``ns.op.overload``; consulted before the built-in table, so a user's formula wins.
CUSTOM_FORMULAS: dict[str, Formula] = {}


def resolve_op(name: str) -> Any:
    """The operator (overload packet, or overload for ``ns.op.overload``) that a name such as
    ``"aten.mm"``, ``"aten.add.Tensor"`` or ``"mylib::op"`` denotes in the running torch;
    None if torch has no such operator."""
    namespace, _, rest = name.replace("::", ".", 1).partition(".")
    op, _, overload = rest.partition(".")
    if not namespace or not op:
        return None
    try:
        packet = getattr(getattr(torch.ops, namespace), op)
        return getattr(packet, overload) if overload else packet
    except (AttributeError, RuntimeError):
        return None


#: Op names registered without checking the running torch has them, by the module whose import
#: defines them: importing it would cost every nnperf start, and its ops can only be in a trace
#: once the traced code imported it. ``tests/passes/costs`` imports each and checks the names.
DEFINED_ON_IMPORT: dict[str, tuple[str, ...]] = {}


def register_defined_on_import(module: str, *names: str) -> Callable[[Formula], Formula]:
    """``register`` for ops a library module defines when imported (FSDP2's ``fsdp::`` copy
    ops): no presence check here (that import takes ~0.6 s); a test makes it."""
    DEFINED_ON_IMPORT[module] = DEFINED_ON_IMPORT.get(module, ()) + names
    return _registering(names)


def _registering(names: tuple[str, ...] | list[str]) -> Callable[[Formula], Formula]:
    """The decorator that files a formula under each name, once."""

    def wrap(fn: Formula) -> Formula:
        for name in names:
            if name in _FORMULAS:
                raise ValueError(f"a cost formula for {name} is already registered")
            _FORMULAS[name] = fn
        return fn

    return wrap


def register(*names: str, since: str | None = None) -> Callable[[Formula], Formula]:
    """Register a formula for op names such as ``"aten.mm"`` (overloads share one formula).

    Every name must be an operator of the running torch: a formula under a name no trace can
    contain would be dead, and a misspelt name would leave the op it meant uncovered, so a
    missing name fails the import (a bug in nnperf's table, not something a user can fix).
    ``since``: the torch version by which the ops exist; on an older torch, names it lacks
    are skipped (those ops cannot appear in its traces) instead of failing.
    """
    older_torch = since is not None and torch.__version__ < since
    present = [n for n in names if resolve_op(n) is not None]
    missing = [n for n in names if n not in present]
    if missing and not older_torch:
        raise RuntimeError(
            f"nnperf's cost registry names ops that torch {torch.__version__} does not have: "
            f"{', '.join(missing)}"
        )
    return _registering(present)


def lookup(event: OpEvent) -> Formula | None:
    """The formula for an event: a user's first, then by name, then by the op's tags
    (pointwise, foreach)."""
    if CUSTOM_FORMULAS:
        fn = CUSTOM_FORMULAS.get(f"{event.name}.{getattr(event.func, '_overloadname', '')}")
        fn = fn or CUSTOM_FORMULAS.get(event.name)
        if fn is not None:
            return fn
    fn = _FORMULAS.get(event.name)
    if fn is not None:
        return fn
    for rule in _FALLBACK_RULES:
        fn = rule(event)
        if fn is not None:
            return fn
    return None


_FALLBACK_RULES: list[Callable[[OpEvent], Formula | None]] = []


def register_rule(rule: Callable[[OpEvent], Formula | None]) -> None:
    """Rules cover whole families (e.g. every op tagged pointwise) without listing each op."""
    _FALLBACK_RULES.append(rule)


def registered_names() -> list[str]:
    return sorted(_FORMULAS)


# -- helpers shared by formulas -------------------------------------------------------------
def tensors(values: Iterable[Any]) -> list[TensorMeta]:
    return [v for v in values if isinstance(v, TensorMeta)]


def numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def written_args(event: OpEvent) -> list[TensorMeta]:
    """Arguments an in-place or out= op writes, from the schema's alias annotations."""
    out: list[TensorMeta] = []
    schema = event.func._schema
    values = list(event.args) + [event.kwargs.get(a.name) for a in schema.arguments[len(event.args) :]]
    for arg, value in zip(schema.arguments, values, strict=False):
        info = arg.alias_info
        if info is None or not info.is_write:
            continue
        if isinstance(value, TensorMeta):
            out.append(value)
        elif isinstance(value, (list, tuple)):
            out.extend(tensors(value))
    return out


def has_tag(event: OpEvent, tag: torch.Tag) -> bool:
    return tag in getattr(event.func, "tags", ())
