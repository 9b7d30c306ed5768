"""Helpers the non-GEMM formulas share: argument binding and the views a kernel really touches.

Bytes are counted from ``TensorMeta`` views, so where a kernel touches less than a whole
argument (a gather reads only the selected rows; a broadcast operand is read at its own size)
the formulas pass a narrower view of the same storage. The counting pass then still knows
whose bytes they are (a weight, an activation) without each formula doing the bookkeeping.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from nnperf.passes.costs.registry import tensors
from nnperf.trace.events import OpEvent, TensorMeta


def bind(event: OpEvent) -> dict[str, Any]:
    """Arguments by schema name, positional and keyword alike, defaults filled in.

    Formulas read ``args["weight"]`` instead of ``event.args[5]``, which breaks silently when
    an overload (``.out``, ``.Scalar``) shifts positions.
    """
    schema = event.func._schema
    bound: dict[str, Any] = {}
    for i, arg in enumerate(schema.arguments):
        if i < len(event.args) and not arg.kwarg_only:
            bound[arg.name] = event.args[i]
        elif arg.name in event.kwargs:
            bound[arg.name] = event.kwargs[arg.name]
        elif arg.has_default_value():
            bound[arg.name] = arg.default_value
        else:
            bound[arg.name] = None
    return bound


def overload(event: OpEvent) -> str:
    """The overload name (``Tensor``, ``Scalar``, ``default``...)."""
    name = event.func._schema.overload_name
    return name or "default"


def footprint(t: TensorMeta) -> TensorMeta:
    """The view with broadcast (stride-0) dimensions collapsed to size 1.

    An ``expand``-ed operand costs no traffic beyond the elements it really holds.
    """
    if all(st != 0 or sz <= 1 for sz, st in zip(t.shape, t.stride, strict=True)):
        return t
    shape = tuple(1 if st == 0 else sz for sz, st in zip(t.shape, t.stride, strict=True))
    return TensorMeta(t.storage, shape, t.dtype, t.stride, t.storage_offset)


def touched(t: TensorMeta, elements: int) -> TensorMeta:
    """A flat view of ``elements`` elements of ``t``'s storage (at most all of ``t``).

    For gathers and scatters: the kernel moves the selected rows, not the whole tensor.
    """
    n = max(0, min(int(elements), footprint(t).numel))
    if n == t.numel:
        return t
    return TensorMeta(t.storage, (n,), t.dtype, (1,), t.storage_offset)


def distinct(metas: Iterable[TensorMeta]) -> list[TensorMeta]:
    """Each view once, in order: ``x * x`` reads ``x`` once."""
    seen: set[tuple[Any, ...]] = set()
    out: list[TensorMeta] = []
    for t in metas:
        key = (t.storage, t.shape, t.stride, t.storage_offset, t.dtype)
        if key not in seen:
            seen.add(key)
            out.append(t)
    return out


def tensor_inputs(event: OpEvent) -> list[TensorMeta]:
    """Every tensor argument (lists flattened), each distinct view once, broadcasts collapsed."""
    flat: list[TensorMeta] = []
    for value in list(event.args) + list(event.kwargs.values()):
        if isinstance(value, TensorMeta):
            flat.append(value)
        elif isinstance(value, (list, tuple)):
            flat.extend(tensors(value))
    return distinct(footprint(t) for t in flat)


def read_args(event: OpEvent) -> list[TensorMeta]:
    """Tensor arguments a kernel reads: everything but ``out=`` buffers, which it only writes."""
    bound = bind(event)
    flat: list[TensorMeta] = []
    for arg in event.func._schema.arguments:
        info = arg.alias_info
        if arg.kwarg_only and info is not None and info.is_write:
            continue
        flat.extend(listed(bound[arg.name]))
    return distinct(footprint(t) for t in flat)


def listed(value: Any) -> list[TensorMeta]:
    """Tensors of a list argument (``Tensor[]``), or the tensor itself, or nothing."""
    if isinstance(value, TensorMeta):
        return [value]
    if isinstance(value, (list, tuple)):
        return tensors(value)
    return []


def is_scalar_bookkeeping(event: OpEvent) -> bool:
    """An optimizer-phase op on 0-dim tensors only: the ``step`` counters.

    PyTorch keeps ``step`` on the host unless the optimizer is fused or capturable, so these
    ops cost the host a little time and the device nothing. (A 0-dim *parameter* would be
    misread as bookkeeping too; models with scalar parameters are rare and the cost tiny.)
    """
    if event.phase != "optimizer":
        return False
    ts = list(event.inputs) + list(event.outputs)
    return bool(ts) and all(len(t.shape) == 0 for t in ts)
