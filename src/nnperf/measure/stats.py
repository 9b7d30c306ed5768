"""Summaries of repeated timings: the median and the spread, never a single sample.

A single timing of a GPU or CPU kernel is noisy (clock ramps, other processes, cache state), so
every measurement in nnperf is a list of repeats summarised by its median with the 10th/90th
percentiles and the inter-quartile range, computed the way ``numpy.percentile`` does by default
(linear interpolation between order statistics) so users can check the figures by hand.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100), linear interpolation between closest ranks."""
    if not values:
        raise ValueError("percentile of an empty list")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside 0..100")
    data = sorted(values)
    pos = (len(data) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


@dataclass(frozen=True)
class Spread:
    """Median and spread of repeated measurements (seconds, bytes/s, ...)."""

    median: float
    p10: float
    p90: float
    q1: float
    q3: float
    minimum: float
    maximum: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        return cls(
            median=percentile(values, 50),
            p10=percentile(values, 10),
            p90=percentile(values, 90),
            q1=percentile(values, 25),
            q3=percentile(values, 75),
            minimum=min(values),
            maximum=max(values),
            n=len(values),
        )

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    @property
    def relative_spread(self) -> float:
        """(p90 - p10) / median: how much to trust the median."""
        return (self.p90 - self.p10) / self.median if self.median else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "median": self.median,
            "p10": self.p10,
            "p90": self.p90,
            "q1": self.q1,
            "q3": self.q3,
            "iqr": self.iqr,
            "min": self.minimum,
            "max": self.maximum,
            "n": self.n,
        }


def relative_error(predicted: float | None, measured: float | None) -> float | None:
    """(predicted - measured) / measured; None when either side is missing or measured is 0."""
    if predicted is None or measured is None or measured == 0:
        return None
    return (predicted - measured) / measured
