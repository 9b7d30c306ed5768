"""What ``advise`` runs in worker processes: re-traced scenarios and largest-batch searches.

A search for the largest batch (``search.fit_batch.largest_batch``) traces its configuration
at several batches, and two of those steps are scenarios advise predicts anyway: the batch
as given (a recomputation item is its step at that batch) and the answer (the batch curve's
last point, or a recomputation item at the largest batch it lets fit). They are the same
steps (the same request and options, traced by ``evaluate.trace_change``), so the worker
that searched prices its own traces (``evaluate.price``) instead of another tracing them
again. The search starts at the batch as given, which it traces for the item anyway (the
search of the configuration as given starts from the base trace's footprint and traces
nothing there): when that batch fits, the answer is at least it, and batch 1 is not needed.

Every job runs through ``search.fit_parallel`` (one process per core, checkpointing searches
first); a user error in one job (a variant that cannot be traced) comes back as its message,
so it is reported beside the others rather than failing them all.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import Any

from nnperf.analysis import Analysis
from nnperf.errors import NnperfError
from nnperf.passes.memory.capacity import capacity
from nnperf.search.advise import affine, batch
from nnperf.search.advise.change import Change, Outcome
from nnperf.search.advise.evaluate import Setup, evaluate, price, trace_change
from nnperf.search.fit import Sample, largest_batch, sample_of
from nnperf.search.fit_parallel import run_searches, search_workers


@dataclass(frozen=True)
class FitJob:
    """The largest batch of the step ``change`` makes (no change: the workload as given, a
    ``recompute``: with that checkpointing), searched from the batch as given."""

    change: Change = field(default_factory=Change)
    given: int = 1  # the batch as given: where the search starts
    seed: Sample | None = None  # that batch's sample where it is the base trace
    price_given: bool = False  # also predict the step at the batch as given
    #: Also predict the batch curve's points that the traces determine (``affine``).
    curve: bool = False
    #: The base trace, for the curve: a worker forked from the process that traced it has it;
    #: traces do not pickle, so a fork-server worker traces the batch as given again.
    base: Analysis | None = field(default=None, compare=False)

    @property
    def checkpoint(self) -> bool:
        """Read by the parallel runner, which starts recomputing (slow) searches first."""
        return self.change.checkpoint

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "base": None}


@dataclass(frozen=True)
class FitOutcome:
    """A search's answer (None: not even one batch fits; str: the error that stopped it) and
    the steps it priced: at the batch as given (when asked) and at the answer (when it is
    another batch)."""

    largest: int | str | None
    at_given: Outcome | str | None = None
    at_largest: Outcome | None = None
    curve: dict[int, Outcome] = field(default_factory=dict)  # batch -> the step there


def run_fit(setup: Setup, job: FitJob) -> FitOutcome:
    """One search, pricing the traces it shares with other scenarios."""
    assert job.seed is None or not job.price_given  # a seed is the base: priced already
    arch = setup.gpu.architecture
    traced: dict[int, Analysis] = {}
    samples: dict[int, Sample] = {job.given: job.seed} if job.seed is not None else {}

    def change_at(batch: int) -> Change:
        # the batch as given is traced as the scenario traces it: the request unchanged
        return replace(job.change, batch=None if batch == job.given else batch)

    def measure(batch: int) -> Sample:
        if batch not in samples:
            analysis = traced[batch] = trace_change(setup, change_at(batch))
            samples[batch] = sample_of(batch, analysis.model, analysis.trace, architecture=arch)
        return samples[batch]

    def priced(batch: int) -> Outcome:
        return price(setup, change_at(batch), traced[batch], {arch: samples[batch].report})

    at_given: Outcome | str | None = None
    if job.price_given:
        try:
            measure(job.given)
        except NnperfError as err:
            return FitOutcome(_message(err), _message(err))
        at_given = priced(job.given)
    try:
        largest = largest_batch(measure, capacity(setup.gpu), max_batch=setup.max_batch,
                                start=job.given).largest
    except NnperfError as err:
        return FitOutcome(_message(err), at_given)
    at_largest = priced(largest) if largest is not None and largest != job.given else None
    curve = _curve(setup, job, largest, traced) if job.curve and largest is not None else {}
    return FitOutcome(largest, at_given, at_largest, curve)


def _curve(setup: Setup, job: FitJob, largest: int, traced: dict[int, Analysis]) -> dict[int, Outcome]:
    """The batch curve's points (but the answer, priced already) built from the search's
    traces and the base (``affine``: exact for a step affine in the batch, checked on them);
    a point they do not determine is left to a trace of its own."""
    points = dict(traced)
    wanted = [b for b in batch.curve_batches(largest, job.given) if b != largest]
    inside = [b for b in wanted if job.given <= b <= max(points, default=0)]
    if job.given not in points and len(inside) >= 2:  # worth a trace of the batch as given
        points[job.given] = job.base if job.base is not None else trace_change(setup, job.change)
    out = {}
    for b in inside:
        built = affine.analysis_at(points, b)
        if built is not None:
            out[b] = price(setup, Change(batch=b), built, {})
    return out


def run_job(setup: Setup, label: str, job: Change | FitJob) -> Any:
    """One worker job: a scenario's outcome or a search's ``FitOutcome``; a user error comes
    back as its message."""
    if isinstance(job, FitJob):
        return run_fit(setup, job)
    try:
        return evaluate(setup, job)
    except NnperfError as err:
        return _message(err)


def run_parallel(setup: Setup, jobs: list[tuple[str, Change | FitJob]],
                 workers: int | None = None) -> dict[str, Any]:
    """``run_job`` for each job, in processes (``search.fit_parallel``); results by label."""
    if not jobs:
        return {}
    n = workers if workers is not None else search_workers(setup.options, len(jobs))
    results = run_searches(functools.partial(run_job, setup), jobs, n)  # type: ignore[arg-type]
    return {label: r for (label, _), r in zip(jobs, results, strict=False)}


def _message(err: NnperfError) -> str:
    return f"{type(err).__name__}: {err}"
