"""Reductions and scans: sum, mean, max/min, var/std, norms, prod, any/all, arg-reductions,
cumulative scans, logsumexp, and sort/top-k.

FLOPs = input elements x per-element cost + output elements x per-output cost (the final
divide of a mean, the sqrt of a norm). A reduction kernel reads its input once and writes
its result: that is the minimum traffic, so the bytes are exactly those.
"""

from __future__ import annotations

import math

from nnperf.passes.costs.common import bind, distinct, footprint, overload
from nnperf.passes.costs.elementwise import elementwise_cost
from nnperf.passes.costs.registry import REDUCTION, OpCost, register
from nnperf.trace.events import OpEvent

# name -> (per input element, per output element)
REDUCE_FLOPS: dict[str, tuple[int, int]] = {
    "sum": (1, 0),
    "nansum": (2, 0),  # isnan select + add
    "mean": (1, 1),
    "nanmean": (2, 1),
    "amax": (1, 0),
    "amin": (1, 0),
    "max": (1, 0),
    "min": (1, 0),
    "aminmax": (2, 0),
    "argmax": (1, 0),
    "argmin": (1, 0),
    "any": (1, 0),
    "all": (1, 0),
    "count_nonzero": (1, 0),
    "prod": (1, 0),
    "var": (4, 1),  # mean, then (x - m)^2 accumulated; divide by N - correction
    "std": (4, 2),  # var plus a sqrt
    "var_mean": (4, 1),
    "std_mean": (4, 2),
    "norm": (2, 1),  # x * x accumulated, sqrt (2-norm; other orders cost about the same)
    "linalg_vector_norm": (2, 1),
    "logsumexp": (4, 2),  # max, sub, exp, add; log and add back the max per output
    "cumsum": (1, 0),
    "cumprod": (1, 0),
    "logcumsumexp": (4, 0),
}


def _reduction_cost(event: OpEvent) -> OpCost:
    if overload(event) == "other":  # max.other / min.other: elementwise maximum, not a reduction
        return elementwise_cost(event)
    per_in, per_out = REDUCE_FLOPS[event.name.removeprefix("aten.")]
    source = footprint(event.inputs[0])
    outputs = distinct(event.outputs)
    result = max((t.numel for t in outputs), default=1)
    return OpCost(
        REDUCTION,
        flops=float(per_in * source.numel + per_out * result),
        reads=distinct(footprint(t) for t in event.inputs),
        writes=outputs,
    )


register(*(f"aten.{name}" for name in REDUCE_FLOPS))(_reduction_cost)


@register("aten.sort", "aten.topk", "aten.argsort", "aten.kthvalue", "aten.median", "aten.msort")
def _sort_cost(event: OpEvent) -> OpCost:
    """Comparison sorts along one dimension: n log2 n comparisons per row (top-k and median
    are counted as full sorts, which is what GPU implementations mostly run)."""
    x = event.inputs[0]
    dim = bind(event).get("dim")
    n = x.numel if dim is None or not x.shape else x.shape[int(dim) % len(x.shape)]
    rows = x.numel // n if n else 0
    comparisons = rows * n * max(1, math.ceil(math.log2(n))) if n > 1 else 0
    return OpCost(
        REDUCTION,
        flops=float(comparisons),
        reads=[footprint(x)],
        writes=distinct(event.outputs),
    )
