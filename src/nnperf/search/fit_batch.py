"""The search for the largest batch of one configuration: traces where they decide,
allocator replays (``search.fit_replay``) in between; see ``search.fit`` for the method."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nnperf.passes.memory import MemoryReport
from nnperf.search.fit_replay import BatchModel, Footprint
from nnperf.search.memory_variants import MemoryOptions

#: Never search beyond this batch: a model this small fits "any batch" for practical purposes.
MAX_BATCH = 1 << 20
#: The second batch traced when no footprint guides the guess: far enough from 1 that
#: allocator rounding does not hide the slope.
FIRST_STEP = 8
#: After this many probes in a row that move the fitting batch by one, bisect (a step-shaped
#: peak near the boundary stalls the secant, which then moves by one batch per trace).
SECANT_PROBES = 2
#: Traces spent on interpolation before falling back to the secant search over traces.
INTERPOLATION_ROUNDS = 8
#: Replayed allocator requests a search may spend ruling out the batches above its answer,
#: per op of the trace: about two traces' worth (a trace costs about as much per op as a
#: replay per 1000 requests). Beyond it the search settles for a verified boundary.
SCAN_REQUESTS_PER_EVENT = 2000


@dataclass
class Probe:
    batch: int
    device_total: int
    peak_allocated: int
    fits: bool


@dataclass(frozen=True)
class Sample:
    """One traced batch: its report and, for a real trace, what interpolation needs."""

    report: MemoryReport
    footprint: Footprint | None = None

    @property
    def total(self) -> int:
        return int(self.report.device_total or 0)


#: Traces the step at a batch.
Measure = Callable[[int], Sample]


@dataclass
class FitResult:
    """The outcome of one search: ``largest`` is None when not even batch 1 fits."""

    label: str
    options: MemoryOptions
    capacity: int
    largest: int | None
    capped: bool  # the search stopped at MAX_BATCH: "at least" this batch
    at_largest: MemoryReport | None
    at_one: MemoryReport  # at batch 1 (at the smallest traced batch: see ``largest_batch``'s start)
    probes: list[Probe] = field(default_factory=list)
    seconds: float = 0.0
    replays: int = 0  # allocator replays of interpolated traces (milliseconds each)
    replay_seconds: float = 0.0  # the time they took (part of ``seconds``)
    #: Every batch above the answer ruled out (by replays and a monotone bound), not only
    #: the next one (by a trace): the answer is then the largest batch that fits.
    exhaustive: bool = True
    #: The traced batches the answer was interpolated between (None: a search over traces).
    interpolated: tuple[int, int] | None = None

    def to_json(self) -> dict[str, Any]:
        rep = self.at_largest
        return {
            "what_if": self.label,
            "options": self.options.describe(),
            "largest_batch": self.largest,
            "capped": self.capped,
            "capacity": self.capacity,
            "device_total_at_largest": rep.device_total if rep else None,
            "peak_allocated_at_largest": rep.peak_allocated if rep else None,
            "device_total_at_batch_1": self.at_one.device_total,
            "traces": len(self.probes),
            "seconds": round(self.seconds, 3),
            "probes": [p.__dict__ for p in self.probes],
        }


def largest_batch(
    measure: Measure,
    capacity: int,
    *,
    label: str = "as given",
    options: MemoryOptions | None = None,
    max_batch: int = MAX_BATCH,
    start: int = 1,
) -> FitResult:
    """Search the largest batch whose predicted device total is at most ``capacity``.

    ``start``: the first batch traced. A caller that has that batch's trace already (the batch
    a workload runs at) saves one: when it fits, the answer is at least it whatever batch 1
    does, and the search goes on from it as it would from batch 1 (batch 1 is traced only
    when ``start`` does not fit). ``at_one`` is then the report at the smallest traced batch.
    """
    began = time.perf_counter()
    search = _Search(measure, capacity, max_batch)
    first = max(1, min(start, max_batch))
    largest: int | None = None
    if search.fits(first):
        largest = first if max_batch <= first else search.run(first)
    elif first > 1 and search.fits(1):
        largest = search.run(1)
    samples = search.samples
    return FitResult(label, options or MemoryOptions(), capacity, largest,
                     largest is not None and largest >= max_batch,
                     samples[largest].report if largest else None, samples[min(samples)].report,
                     search.probes, time.perf_counter() - began, *search.replay_cost(),
                     exhaustive=search.exhaustive, interpolated=search.pair)


class _Search:
    """The traced batches of one search and the decisions taken on them."""

    def __init__(self, measure: Measure, capacity: int, max_batch: int):
        self._measure = measure
        self.capacity = capacity
        self.max_batch = max_batch
        self.samples: dict[int, Sample] = {}
        self.probes: list[Probe] = []
        self._model: BatchModel | None = None
        self._answer = 0  # the current model's largest fitting batch
        self._checked: set[int] = set()  # traced batches the current model reproduces
        self._spent: list[BatchModel] = []  # models no longer current (for their cost)
        self.exhaustive = True  # every batch above the answer ruled out, not only the next
        self.pair: tuple[int, int] | None = None  # the batches the answer's model came from

    def replay_cost(self) -> tuple[int, float]:
        """Allocator replays run by this search and the seconds they took."""
        models = [*self._spent, *([self._model] if self._model else [])]
        return sum(m.replays for m in models), sum(m.seconds for m in models)

    # -- traces -----------------------------------------------------------------------------
    def trace(self, batch: int) -> Sample:
        if batch not in self.samples:
            s = self._measure(batch)
            self.samples[batch] = s
            self.probes.append(Probe(batch, s.total, int(s.report.peak_allocated or 0),
                                     s.total <= self.capacity))
        return self.samples[batch]

    def fits(self, batch: int) -> bool:
        return self.trace(batch).total <= self.capacity

    # -- the search -------------------------------------------------------------------------
    def run(self, first: int = 1) -> int:
        """The answer, given that batch ``first`` fits and the range goes beyond it."""
        one = self.samples[first].footprint
        if one is None:  # reports only (no allocator requests): search over traces
            self.fits(min(max(FIRST_STEP, 2 * first), self.max_batch))
            return self.bracket()
        self.fits(self.guess(one))
        for _ in range(INTERPOLATION_ROUNDS):
            answer = self.propose()
            if answer is None:  # no two traces of the same structure yet: guess again
                batch = self.another_guess()
            else:
                batch = next((b for b in (answer, answer + 1)
                              if b <= self.max_batch and b not in self.samples), None)
                if batch is None:  # both traced: the answer stands or the search falls back
                    if self.verified(answer):
                        assert self._model is not None
                        self.pair = (self._model.b0, self._model.b0 + self._model.span)
                        return answer
                    return self.bracket()
            if batch is None:
                break
            self.fits(batch)
        return self.bracket()

    def guess(self, traced: Footprint) -> int:
        """Where to trace next: the answer if the activations of ``traced`` scaled with the
        batch and nothing else did."""
        model = BatchModel.scaled(traced)
        guess = model.boundary(self.capacity, self.max_batch)
        self._spent.append(model)
        return max(2, min(guess, self.max_batch))

    def another_guess(self) -> int | None:
        """With no two traces of the same structure (the step differs at batch 1, say): the
        guess from the latest trace (larger, so closer to linear), or a batch next to it."""
        latest = self.samples[self.probes[-1].batch].footprint
        if latest is not None:
            batch = self.guess(latest)
            if batch not in self.samples:
                return batch
        return self.neighbour()

    def propose(self) -> int | None:
        """The largest fitting batch by interpolation between two traces of the same step
        (None: no such pair). A model that reproduces every trace taken since is kept."""
        if self._model is not None and self._reproduces_traces():
            return self._answer
        if self._model is not None:
            self._spent.append(self._model)
            self._model = None
        pair = self._pair()
        if pair is None:
            return None
        model = BatchModel.between(*pair)
        if not model.monotone:  # no monotone bound to rule out the batches above
            self._spent.append(model)
            return None
        self._model, self._checked = model, {pair[0].batch, pair[1].batch}
        budget = SCAN_REQUESTS_PER_EVENT * model.template.events
        answer, self.exhaustive = model.largest(self.capacity, self.max_batch, budget)
        self._answer = max(1, answer)
        return self._answer

    def _reproduces_traces(self) -> bool:
        """Whether the current model gives every traced total exactly. A trace of another
        structure (a step that changes with the batch) below the answer is no evidence
        against it: the model claims nothing there."""
        assert self._model is not None
        template = self._model.template
        for batch, s in self.samples.items():
            if batch in self._checked:
                continue
            fp = s.footprint
            same = fp is not None and fp.matches(template)
            if not same and fp is not None and batch < self._answer:
                continue
            if not same or self._model.total(batch) != s.total:
                return False
            self._checked.add(batch)
        return True

    def _pair(self) -> tuple[Footprint, Footprint] | None:
        """The two traces of the same structure nearest the latest one (widest on ties)."""
        target = self.probes[-1].batch
        traced = [s.footprint for s in self.samples.values() if s.footprint is not None]
        best: tuple[int, int] | None = None
        choice = None
        for i, a in enumerate(traced):
            for c in traced[i + 1:]:
                if not a.matches(c):
                    continue
                key = (abs(a.batch - target) + abs(c.batch - target), -abs(a.batch - c.batch))
                if best is None or key < best:
                    best, choice = key, (a, c)
        return choice

    def neighbour(self) -> int | None:
        """A batch next to the latest trace, on the side where the answer lies."""
        last = self.probes[-1]
        order = (last.batch + 1, last.batch - 1) if last.fits else (last.batch - 1, last.batch + 1)
        return next((b for b in order if 1 <= b <= self.max_batch and b not in self.samples),
                    None)

    def verified(self, answer: int) -> bool:
        """The traces agree with ``answer``: it fits, the next batch does not (or is beyond
        the range) and no traced batch above it fits."""
        return self.fits(answer) and not any(
            b > answer and self.fits(b) for b in self.samples
        ) and (answer >= self.max_batch or answer + 1 in self.samples)

    # -- the fallback: secant and bisection over traces ---------------------------------------
    def bounds(self) -> tuple[int, int | None]:
        """The largest traced batch that fits and the smallest traced one above it that does
        not (None: none traced)."""
        lo = max(b for b in self.samples if self.fits(b))
        above = [b for b in self.samples if b > lo]
        return lo, min(above) if above else None

    def bracket(self) -> int:
        """Secant steps (chord from batch 1 until a batch fails) and bisection when the secant
        creeps, until the largest fitting and the smallest failing traced batch are adjacent."""
        creeping = 0  # consecutive probes that could only move the bound by one batch
        total = self.trace
        for _ in range(64):
            lo, hi = self.bounds()
            self.exhaustive = lo >= self.max_batch  # a boundary: batches above hi not ruled out
            if lo >= self.max_batch or (hi is not None and hi - lo <= 1):
                return lo
            if hi is None:  # extrapolate along the chord from the smallest traced batch (batch
                # 1 unless the search started above it: the widest chord, the least noisy)
                low = min(self.samples)
                slope = (total(lo).total - total(low).total) / (lo - low) if lo > low else 0
                # no growth measured yet (allocator rounding hides it): double
                cand = lo * 2 if slope <= 0 else lo + int((self.capacity - total(lo).total) // slope)
                cand = max(lo + 1, min(cand, self.max_batch))
            else:  # interpolate between the bracketing batches
                slope = (total(hi).total - total(lo).total) / (hi - lo)
                cand = (lo + int((self.capacity - total(lo).total) // slope) if slope > 0
                        else (lo + hi) // 2)
                cand = max(lo + 1, min(cand, hi - 1))
                if cand == lo + 1 and creeping >= SECANT_PROBES:
                    cand = (lo + hi) // 2  # peaks move in steps near the boundary: bisect
            creeping = creeping + 1 if cand == lo + 1 else 0
            self.fits(cand)
        return self.bounds()[0]
