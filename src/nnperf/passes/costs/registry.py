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

# Categories decide how the time model treats an op.
GEMM = "gemm"  # matmul-like: tensor cores, tile/wave quantization
CONV = "conv"  # convolution (implicit GEMM)
ATTENTION = "attention"  # fused flash attention
ELEMENTWISE = "elementwise"  # memory-bound pointwise
REDUCTION = "reduction"
NORM = "norm"
MEMORY = "memory"  # copies, casts, cat, index, fills
OPTIMIZER = "optimizer"  # foreach / fused optimizer kernels
ALLOC = "alloc"  # allocation only: no kernel
HOST = "host"  # runs on the host (scalar bookkeeping, .item()): no device kernel


@dataclass(frozen=True, slots=True)
class OpCost:
    """What an op costs at minimum. ``reads``/``writes`` are counted once per distinct view."""

    category: str
    flops: float = 0.0
    macs: float = 0.0
    reads: Sequence[TensorMeta] = ()
    writes: Sequence[TensorMeta] = ()
    extra_read_bytes: float = 0.0  # traffic not tied to one tensor (e.g. a broadcast mask)
    extra_write_bytes: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)


Formula = Callable[[OpEvent], OpCost]
_FORMULAS: dict[str, Formula] = {}


def register(*names: str) -> Callable[[Formula], Formula]:
    """Register a formula for op names such as ``"aten.mm"`` (overloads share one formula)."""

    def wrap(fn: Formula) -> Formula:
        for name in names:
            if name in _FORMULAS:
                raise ValueError(f"a cost formula for {name} is already registered")
            _FORMULAS[name] = fn
        return fn

    return wrap


def lookup(event: OpEvent) -> Formula | None:
    """The formula for an event: by name first, then by the op's tags (pointwise, foreach)."""
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
