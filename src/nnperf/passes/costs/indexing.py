"""Indexing: gathers, scatters and the backward ops of slicing and selecting.

A gather (``index``, ``index_select``, ``gather``) reads its indices and only the elements
they select, and writes the result. An out-of-place scatter (``scatter``, ``index_put``,
``index_add``) copies its whole input and then writes the selected positions; the in-place
forms (``scatter_``, ``index_put_``...) write only the selected positions. Accumulating
scatters (``scatter_add``, ``index_add``, ``index_put`` with ``accumulate``) also read the
old values there and do one add per source element. ``slice_backward`` / ``select_backward``
write a full zero-filled gradient and copy grad_output into it.
"""

from __future__ import annotations

from nnperf.passes.costs.common import bind, distinct, footprint, listed, read_args, touched
from nnperf.passes.costs.registry import MEMORY, OpCost, numel, register
from nnperf.trace.events import OpEvent


@register("aten.index", "aten._unsafe_index", "aten.index_select", "aten.take")
def _index(event: OpEvent) -> OpCost:
    args = bind(event)
    src = args["self"]
    out = event.outputs[0]
    indices = listed(args.get("indices")) + listed(args.get("index"))
    return OpCost(
        MEMORY,
        reads=distinct([*indices, touched(src, out.numel)]),
        writes=[out],
        info={"gather": True},
    )


@register("aten.gather")
def _gather(event: OpEvent) -> OpCost:
    args = bind(event)
    index = args["index"]
    return OpCost(
        MEMORY,
        reads=[index, touched(args["self"], index.numel)],
        writes=[event.outputs[0]],
        info={"gather": True},
    )


_ACCUMULATING = {
    "aten.scatter_add",
    "aten.scatter_add_",
    "aten.scatter_reduce",
    "aten.scatter_reduce_",
    "aten.index_add",
    "aten.index_add_",
}


def _selected(event: OpEvent, args: dict) -> int:
    """How many positions of ``self`` a scatter writes."""
    index = args.get("index")
    source = args.get("src", args.get("source"))
    if event.name.startswith("aten.index_add") or event.name.startswith("aten.index_copy"):
        return footprint(source).numel if source is not None else 0
    if event.name.startswith("aten.index_fill"):
        self_ = args["self"]
        dim = int(args["dim"]) % max(1, len(self_.shape))
        return index.numel * (numel(self_.shape) // max(1, self_.shape[dim] if self_.shape else 1))
    if index is not None:  # scatter*: one position per index element
        return index.numel
    # index_put: the indexed rows times the trailing dimensions left unindexed
    idx = [t for t in listed(args.get("indices"))]
    self_ = args["self"]
    rows = max((t.numel for t in idx), default=0)
    return rows * numel(self_.shape[len(listed(args.get("indices"))) :])


@register(
    "aten.scatter",
    "aten.scatter_",
    "aten.scatter_add",
    "aten.scatter_add_",
    "aten.scatter_reduce",
    "aten.scatter_reduce_",
    "aten.index_put",
    "aten.index_put_",
    "aten._index_put_impl_",
    "aten._unsafe_index_put",
    "aten.index_add",
    "aten.index_add_",
    "aten.index_copy",
    "aten.index_copy_",
    "aten.index_fill",
    "aten.index_fill_",
)
def _scatter(event: OpEvent) -> OpCost:
    args = bind(event)
    self_ = args["self"]
    n = _selected(event, args)
    accumulate = event.name in _ACCUMULATING or bool(args.get("accumulate"))
    in_place = event.name.endswith("_")
    others = [t for t in read_args(event) if t.storage != self_.storage]
    if in_place:
        target = touched(self_, n)
        reads = others + ([target] if accumulate else [])
        writes = [target]
    else:
        reads = [footprint(self_), *others]
        writes = distinct(event.outputs)
    flops = n if accumulate else 0
    if event.name.startswith("aten.index_add") and args.get("alpha") not in (None, 1):
        flops *= 2
    return OpCost(
        MEMORY, flops=float(flops), reads=distinct(reads), writes=writes, info={"scatter": True}
    )


@register(
    "aten.slice_backward",
    "aten.select_backward",
    "aten.diagonal_backward",
)
def _view_backward(event: OpEvent) -> OpCost:
    grad = bind(event)["grad_output"]
    return OpCost(MEMORY, reads=[footprint(grad)], writes=[event.outputs[0]])
