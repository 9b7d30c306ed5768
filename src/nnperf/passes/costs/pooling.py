"""Max and average pooling (1d/2d/3d, fixed and adaptive windows), forward and backward.

Forward FLOPs = output elements x window size: comparisons for max, additions (the last one
standing in for the divide) for average. Adaptive windows vary per output position; their
exact total is the product over spatial dimensions of the summed window lengths. Bytes:
the input read and the output (plus max-pool indices) written once.

Backward: max pooling scatters each grad_output element to the argmax recorded in the
indices (one add per grad_output element: windows may overlap), reading grad_output and the
indices, writing a full grad_input; it never needs the forward input. Average pooling
spreads each grad_output element over its window (window-size FLOPs per element).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from nnperf.passes.costs.common import bind, distinct, footprint
from nnperf.passes.costs.registry import REDUCTION, OpCost, numel, register
from nnperf.trace.events import OpEvent, TensorMeta


def spatial_dims(event: OpEvent) -> int:
    """1, 2 or 3, from the op name (``max_pool2d_with_indices`` -> 2)."""
    found = re.search(r"pool(\d)d", event.name)
    return int(found.group(1)) if found else 2


def window_size(kernel_size: Sequence[int] | int, dims: int) -> int:
    """Elements in one window; a single kernel size applies to every spatial dimension."""
    ks = [int(kernel_size)] if isinstance(kernel_size, int) else [int(k) for k in kernel_size]
    if len(ks) == 1:
        ks = ks * dims
    return numel(ks)


def adaptive_window_total(in_sizes: Sequence[int], out_sizes: Sequence[int]) -> int:
    """Sum over output positions of their window size, per (batch, channel) plane.

    PyTorch's adaptive window for output i covers [floor(i*I/O), ceil((i+1)*I/O)).
    """
    total = 1
    for size_in, size_out in zip(in_sizes, out_sizes, strict=True):
        total *= sum(
            -(-((i + 1) * size_in) // size_out) - (i * size_in) // size_out for i in range(size_out)
        )
    return total


def _planes(t: TensorMeta, dims: int) -> int:
    return numel(t.shape[: len(t.shape) - dims])


@register(
    "aten.max_pool1d",
    "aten.max_pool2d",
    "aten.max_pool3d",
    "aten.max_pool1d_with_indices",
    "aten.max_pool2d_with_indices",
    "aten.max_pool3d_with_indices",
    "aten.avg_pool1d",
    "aten.avg_pool2d",
    "aten.avg_pool3d",
)
def _pool(event: OpEvent) -> OpCost:
    args = bind(event)
    out = event.outputs[0]
    window = window_size(args["kernel_size"], spatial_dims(event))
    return OpCost(
        REDUCTION,
        flops=float(out.numel * window),
        reads=[footprint(args["self"])],
        writes=distinct(event.outputs),
        info={"window": window},
    )


@register(
    "aten._adaptive_avg_pool2d",
    "aten._adaptive_avg_pool3d",
    "aten.adaptive_avg_pool1d",
    "aten.adaptive_max_pool1d",
    "aten.adaptive_max_pool2d",
    "aten.adaptive_max_pool3d",
)
def _adaptive_pool(event: OpEvent) -> OpCost:
    dims = spatial_dims(event)
    x = bind(event)["self"]
    out = event.outputs[0]
    total = _planes(x, dims) * adaptive_window_total(x.shape[-dims:], out.shape[-dims:])
    return OpCost(
        REDUCTION, flops=float(total), reads=[footprint(x)], writes=distinct(event.outputs)
    )


@register(
    "aten.max_pool2d_with_indices_backward",
    "aten.max_pool3d_with_indices_backward",
    "aten.adaptive_max_pool2d_backward",
    "aten.adaptive_max_pool3d_backward",
)
def _max_pool_backward(event: OpEvent) -> OpCost:
    args = bind(event)
    grad = args["grad_output"]
    return OpCost(
        REDUCTION,
        flops=float(grad.numel),
        reads=[footprint(grad), args["indices"]],
        writes=[event.outputs[0]],
        info={"scatter_add": True},
    )


@register("aten.avg_pool2d_backward", "aten.avg_pool3d_backward")
def _avg_pool_backward(event: OpEvent) -> OpCost:
    args = bind(event)
    grad = args["grad_output"]
    window = window_size(args["kernel_size"], spatial_dims(event))
    return OpCost(
        REDUCTION,
        flops=float(grad.numel * window),
        reads=[footprint(grad)],
        writes=[event.outputs[0]],
        info={"window": window},
    )


@register("aten._adaptive_avg_pool2d_backward", "aten._adaptive_avg_pool3d_backward")
def _adaptive_avg_pool_backward(event: OpEvent) -> OpCost:
    dims = spatial_dims(event)
    args = bind(event)
    grad, x = args["grad_output"], args["self"]
    total = _planes(x, dims) * adaptive_window_total(x.shape[-dims:], grad.shape[-dims:])
    return OpCost(REDUCTION, flops=float(total), reads=[footprint(grad)], writes=[event.outputs[0]])
