"""Softmax and log-softmax, forward and backward, as the single-pass row kernels GPUs run.

Forward: max, subtract, exp, sum, divide (log-softmax: subtract the log of the sum instead)
= 5 FLOPs per element. Backward: softmax: y * (g - sum(g * y)); log-softmax:
g - exp(y) * sum(g): 4 per element. The kernel reads each input and writes the output once.
"""

from __future__ import annotations

from nnperf.passes.costs.common import distinct, footprint
from nnperf.passes.costs.registry import REDUCTION, OpCost, register
from nnperf.trace.events import OpEvent

SOFTMAX_FLOPS = 5
SOFTMAX_BACKWARD_FLOPS = 4
SAFE_SOFTMAX_FLOPS = 6  # plus the all-masked-row check


def _row_kernel(event: OpEvent, per_element: int) -> OpCost:
    out = event.outputs[0]
    return OpCost(
        REDUCTION,
        flops=float(per_element * out.numel),
        reads=distinct(footprint(t) for t in event.inputs),
        writes=[out],
    )


@register("aten._softmax", "aten._log_softmax", "aten.softmax", "aten.log_softmax")
def _softmax(event: OpEvent) -> OpCost:
    return _row_kernel(event, SOFTMAX_FLOPS)


@register("aten._safe_softmax", since="2.5")  # added in torch 2.5 (SDPA's math path)
def _safe_softmax(event: OpEvent) -> OpCost:
    return _row_kernel(event, SAFE_SOFTMAX_FLOPS)


@register("aten._softmax_backward_data", "aten._log_softmax_backward_data")
def _softmax_backward(event: OpEvent) -> OpCost:
    return _row_kernel(event, SOFTMAX_BACKWARD_FLOPS)
