"""Run the searches of one fit (the configuration as given and its what-ifs) in processes.

Why: each search is seconds of single-threaded Python (tracing on fake tensors, replaying
the allocator) and the searches share nothing, so on N cores N of them run in the time of
one (llama-7b at 2048 tokens: five searches, 45 s one after the other on two cores).

Why fork: a forked worker starts with the parent's imports and with the request as given
(a model object, a loss function: nothing to pickle, no torch import of several seconds per
worker); only the results travel back. Where fork is not safe (not Linux; ``--real``, whose
CPU kernels may have started thread pools that a fork does not carry) or there is one core,
the searches run in this process, one after the other. Either way each result is the one
the search gives on its own.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from typing import TYPE_CHECKING

from nnperf.errors import NnperfError

if TYPE_CHECKING:
    from nnperf.search.fit import FitResult
    from nnperf.search.memory_variants import MemoryOptions

Job = tuple[str, "MemoryOptions"]
Search = Callable[[str, "MemoryOptions"], "FitResult"]

#: Set to a number of processes to override the choice (1: no processes).
WORKERS_ENV = "NNPERF_FIT_WORKERS"

# What forked workers run: set by ``run_searches`` just before the fork, read by ``_run``.
_search: Search | None = None
_jobs: list[Job] = []


def search_workers(options: MemoryOptions, jobs: int) -> int:
    """How many processes to search ``jobs`` configurations in: one per core, at most one
    per job, 1 where forking is not safe (see the module docstring) or ``NNPERF_FIT_WORKERS``
    says so."""
    if jobs <= 1 or options.trace.real or sys.platform != "linux":
        return 1
    env = os.environ.get(WORKERS_ENV, "").strip()
    cores = int(env) if env.isdigit() else len(os.sched_getaffinity(0))
    return max(1, min(cores, jobs))


def run_searches(search: Search, jobs: list[Job], workers: int) -> list[FitResult]:
    """``[search(*job) for job in jobs]``, in ``workers`` forked processes when above 1.

    Checkpointing searches go first (their traces recompute every block, so they are the
    slow ones); results come back in the jobs' order. A search that fails with an nnperf
    error fails the fit with it, as it would here; any other failure in a worker (an error
    that cannot travel back, a worker killed) reruns that search here, so the error, if it
    is one, is the search's own.
    """
    if workers <= 1 or len(jobs) <= 1:
        return [search(label, opts) for label, opts in jobs]
    global _search, _jobs
    _search, _jobs = search, list(jobs)
    order = sorted(range(len(jobs)), key=lambda i: not jobs[i][1].checkpoint)
    try:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
            futures = {i: pool.submit(_run, i) for i in order}
            return [_result(futures, i, search, jobs[i]) for i in range(len(jobs))]
    finally:
        _search, _jobs = None, []


def _result(futures: dict[int, Future], i: int, search: Search, job: Job) -> FitResult:
    try:
        return futures[i].result()
    except NnperfError:
        for f in futures.values():
            f.cancel()
        raise
    except Exception:
        return search(*job)


def _run(i: int) -> FitResult:
    """A worker's job: the ``i``-th search (the fork inherited ``_search`` and ``_jobs``)."""
    assert _search is not None
    return _search(*_jobs[i])
