"""The trace of a step at another batch, from traces of the same step at other batches.

Why: the batch curve of ``advise`` predicts the step at several batches, and a trace costs a
second of fake-tensor dispatch per thousand ops, while the largest-batch search has traced
the same step at several batches already.

When it is exact: a step whose recorded ops depend on the batch only through numbers that
are affine in it (tensor sizes, strides, offsets, byte counts, size arguments such as a
view's shape) records, at any batch, the same ops in the same order with those numbers on
the same line. Its trace at batch ``b`` is then every number of the traces taken at other
batches carried along its line to ``b``, and every other value (an op, a dtype, a module
name, a storage id: the recorder numbers storages in order) unchanged. The line goes
through two of the traces; the others must lie on it exactly, number for number (integers
compared exactly, a float as the exact rational it is), or nothing is built. Two of them at
consecutive batches (the search's answer and the batch after it) leave no room for a
rounding (``b // 2``, a size padded to a multiple of 8) to pass unnoticed, and a step whose
ops change with the batch (a branch on the size, a chunk count) does not match its own trace
at another batch. What the traces cannot show is a step that leaves its line only between
the batches traced and comes back to it; ``interpolate`` builds nothing beyond the
batches it was given.
"""

from __future__ import annotations

import functools
from dataclasses import fields, is_dataclass, replace
from fractions import Fraction
from typing import Any

from nnperf.analysis import Analysis
from nnperf.trace.events import Trace


class NotAffine(Exception):
    """The traces are not one affine function of the batch (or not the same step)."""


def interpolate(traces: dict[int, Trace], batch: int) -> Trace | None:
    """The trace at ``batch`` (between the smallest and the largest traced batch) from three
    or more traces of the same step, two of them at consecutive batches, or None where they
    do not lie on one line."""
    batches = sorted(traces)
    consecutive = any(b + 1 in traces for b in batches)
    if len(batches) < 3 or not consecutive or not batches[0] <= batch <= batches[-1]:
        return None
    line = _Line(batches, batch)
    try:
        return line.value([traces[b] for b in batches])
    except NotAffine:
        return None


def analysis_at(analyses: dict[int, Analysis], batch: int) -> Analysis | None:
    """``interpolate`` for analyses: the counts of the built trace, its workload's samples
    and tokens carried along their lines too (the model object is the one traced)."""
    trace = interpolate({b: a.trace for b, a in analyses.items()}, batch)
    if trace is None:
        return None
    first = analyses[min(analyses)]
    line = _Line(sorted(analyses), batch)
    try:
        samples, tokens = line.value([(a.workload.samples, a.workload.tokens)
                                      for _, a in sorted(analyses.items())])
    except NotAffine:
        return None
    workload = replace(first.workload, inputs=(), samples=samples, tokens=tokens)
    return Analysis.from_trace(first.model, first.options, trace, workload)


class _Line:
    """Carries every number of a value traced at ``batches`` to ``batch``."""

    def __init__(self, batches: list[int], batch: int):
        self.batches, self.batch = batches, batch
        self.lo, self.hi = batches[0], batches[-1]
        self.span = self.hi - self.lo

    def number(self, values: list[Any]) -> Any:
        first = values[0]
        for v in values:
            if v != first:
                break
        else:
            return first  # the same at every batch (most numbers are)
        exact = [Fraction(v) for v in values]
        slope = (exact[-1] - exact[0]) / self.span
        for b, v in zip(self.batches, exact, strict=True):
            if exact[0] + slope * (b - self.lo) != v:
                raise NotAffine
        out = exact[0] + slope * (self.batch - self.lo)
        if isinstance(first, int):
            if out.denominator != 1:
                raise NotAffine
            return int(out)
        as_float = float(out)
        if Fraction(as_float) != out:
            raise NotAffine  # not a float the step could have computed exactly
        return as_float

    def value(self, values: list[Any]) -> Any:
        first = values[0]
        kind = type(first)
        for v in values:
            if type(v) is not kind:
                raise NotAffine
        if kind is int or kind is float:
            return self.number(values)
        if kind is tuple or kind is list:
            n = len(first)
            for v in values:
                if len(v) != n:
                    raise NotAffine
            return kind([self.value(list(parts)) for parts in zip(*values, strict=True)])
        if kind is dict:
            keys = list(first)
            for v in values:
                if len(v) != len(keys) or list(v) != keys:
                    raise NotAffine
            return {k: self.value([v[k] for v in values]) for k in keys}
        names, frozen = _fields(kind)
        if names is not None:
            if frozen and all(v == first for v in values):
                return first  # immutable and the same at every batch (a parameter's metadata)
            return kind(**{n: self.value([getattr(v, n) for v in values]) for n in names})
        # anything else (an op, a dtype, a string, an enum, None, a bool) stays as it is
        for v in values:
            if v is not first and v != first:
                raise NotAffine
        return first


@functools.cache
def _fields(kind: type) -> tuple[tuple[str, ...] | None, bool]:
    """The constructor's fields of a dataclass (None: not a dataclass) and whether it is frozen."""
    if not is_dataclass(kind):
        return None, False
    return tuple(f.name for f in fields(kind) if f.init), kind.__dataclass_params__.frozen  # type: ignore[attr-defined]
