"""Embedding lookups and their gradients.

Forward is a gather: it reads the indices and only the rows they select (at most the whole
table), and writes one row per index. Backward is a scatter-add: it reads grad_output and
the indices and writes a full, dense grad_weight (zero-filled, then each index's row added
in; CUDA sorts the indices first so duplicates are summed without atomics). FLOPs are the
additions of that scatter: one per grad_output element.
"""

from __future__ import annotations

from nnperf.passes.costs.common import bind, distinct, touched
from nnperf.passes.costs.registry import MEMORY, OpCost, register
from nnperf.trace.events import OpEvent


@register("aten.embedding")
def _embedding(event: OpEvent) -> OpCost:
    args = bind(event)
    weight, indices = args["weight"], args["indices"]
    out = event.outputs[0]
    return OpCost(
        MEMORY,
        reads=[indices, touched(weight, out.numel)],
        writes=[out],
        info={"gather": True},
    )


@register("aten.embedding_dense_backward")
def _embedding_backward(event: OpEvent) -> OpCost:
    args = bind(event)
    grad, indices = args["grad_output"], args["indices"]
    grad_weight = event.outputs[0]
    return OpCost(
        MEMORY,
        flops=float(grad.numel),
        reads=[grad, indices],
        writes=[grad_weight],
        info={"scatter_add": True, "indices": indices.numel},
    )


@register("aten._embedding_bag", "aten._embedding_bag_forward_only")
def _embedding_bag(event: OpEvent) -> OpCost:
    """Gather then reduce each bag: one add (or max) per gathered element."""
    args = bind(event)
    weight, indices = args["weight"], args["indices"]
    dim = weight.shape[-1] if weight.shape else 1
    gathered = indices.numel * dim
    extras = [t for t in (args.get("offsets"), args.get("per_sample_weights")) if t is not None]
    return OpCost(
        MEMORY,
        flops=float(gathered * (2 if args.get("per_sample_weights") is not None else 1)),
        reads=[indices, *extras, touched(weight, gathered)],
        writes=distinct(event.outputs),
        info={"gather": True},
    )


@register(
    "aten._embedding_bag_backward",
    "aten._embedding_bag_dense_backward",
    "aten._embedding_bag_per_sample_weights_backward",
)
def _embedding_bag_backward(event: OpEvent) -> OpCost:
    args = bind(event)
    grad, indices = args["grad"], args["indices"]
    dim = grad.shape[-1] if grad.shape else 1
    reads = [
        t for t in (grad, indices, args.get("offset2bag"), args.get("bag_size")) if t is not None
    ]
    return OpCost(
        MEMORY,
        flops=float(indices.numel * dim),
        reads=distinct(reads),
        writes=distinct(event.outputs),
        info={"scatter_add": True, "indices": indices.numel},
    )
