"""Run the searches of one fit (the configuration as given and its what-ifs) in processes.

Why: each search is seconds of single-threaded Python (tracing on fake tensors, replaying
the allocator) and the searches share nothing, so on N cores N of them run in the time of
one (llama-7b at 2048 tokens: five searches, 45 s one after the other on two cores).

How the workers start:

- ``fork`` where it is safe: a forked worker starts with the parent's imports and with the
  search as given (a model object, a loss function: nothing to pickle, no torch import of
  seconds per worker); only the results travel back. This is the ``nnperf fit`` case.
- ``forkserver`` once this process has run a backward that started autograd's device
  threads (PyTorch builds with CUDA start them even on a machine without a GPU, on the
  first backward of fake tensors): a child forked after that fails its first backward
  ("Unable to handle autograd's threading in combination with fork-based
  multiprocessing"). A notebook that analyzes, then fits, gets there. The fork server is a
  fresh interpreter that imports torch and nnperf and traces one inference step once (a few
  seconds, paid once per process and overlapped with this process's own set-up: it stays
  up for later fits) and forks clean, warm workers; the search and its jobs are pickled to
  them. A search that does not pickle (a model class defined in a
  notebook cell, a lambda loss) runs here instead.
- in this process, one search after the other, where neither applies (not Linux;
  ``--real``, whose CPU kernels may have started thread pools a fork does not carry; one
  core).

Either way each result is the one the search gives on its own.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import pickle
import signal
import sys
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from nnperf import progress, stopping
from nnperf.errors import NnperfError

if TYPE_CHECKING:
    from nnperf.search.fit import FitResult
    from nnperf.search.memory_variants import MemoryOptions

Job = tuple[str, "MemoryOptions"]
Search = Callable[[str, "MemoryOptions"], "FitResult"]
T = TypeVar("T")

#: Set to a number of processes to override the choice (1: no processes).
WORKERS_ENV = "NNPERF_FIT_WORKERS"
#: What the fork server imports before it forks workers: everything a search needs, warmed
#: up by one inference trace (see ``fit_server``).
FORKSERVER_PRELOAD = ["nnperf.search.fit_server_first", "nnperf.search.fit_server"]
#: The name PyTorch gives autograd's per-device worker threads (``Engine::thread_init``).
_AUTOGRAD_THREAD = "pt_autograd_"

# What a worker runs: inherited by a forked worker, installed by ``_install`` otherwise.
_search: Search | None = None
_jobs: list[Job] = []


def search_workers(options: MemoryOptions, jobs: int) -> int:
    """How many processes to search ``jobs`` configurations in: one per core, at most one
    per job, 1 where processes are not safe (see the module docstring) or
    ``NNPERF_FIT_WORKERS`` says so."""
    if jobs <= 1 or options.trace.real or sys.platform != "linux":
        return 1
    env = os.environ.get(WORKERS_ENV, "").strip()
    cores = int(env) if env.isdigit() else len(os.sched_getaffinity(0))
    return max(1, min(cores, jobs))


def fork_is_safe() -> bool:
    """Whether a child forked now can run autograd: no autograd device thread has started in
    this process (PyTorch marks every child forked after they start as unable to run a
    backward). Read from the threads' names, so nothing is forked to find out."""
    tasks = Path("/proc/self/task")
    if not tasks.is_dir():
        return False
    for task in tasks.iterdir():
        try:
            if (task / "comm").read_text().startswith(_AUTOGRAD_THREAD):
                return False
        except OSError:  # the thread ended while we looked
            continue
    return True


def start_method() -> str:
    """``fork`` while it is safe, else ``forkserver`` (see the module docstring)."""
    return "fork" if fork_is_safe() else "forkserver"


def prepare(workers: int, *, backward_first: bool = False) -> None:
    """Start the fork server early when the searches will need it, so that its imports and
    warm-up (seconds) run while this process does its own set-up (a no-op otherwise, and when
    it already runs). ``backward_first``: this process traces a backward before the searches
    (advise's step as given), which on a build with CUDA starts autograd's device threads and so
    rules out forking (the module docstring): the server is started now, where waiting would
    start it only once the searches wait for it. Told by the build, not by running a backward
    and looking: the threads take their names a fraction of a millisecond after it returns."""
    if workers <= 1:
        return
    if start_method() == "forkserver" or (backward_first and _backward_starts_device_threads()):
        _context("forkserver")


def _backward_starts_device_threads() -> bool:
    """Whether a backward in this build starts autograd's per-device threads: a build with CUDA
    (or ROCm, which reports itself so) does, with a GPU or without."""
    import torch

    return torch.backends.cuda.is_built()


def run_searches(search: Search, jobs: list[Job], workers: int,
                 method: str | None = None) -> list[FitResult]:
    """``[search(*job) for job in jobs]``, in ``workers`` processes when above 1.

    ``method`` is the start method (None: ``start_method()``). Checkpointing searches go
    first (their traces recompute every block, so they are the slow ones); results come back
    in the jobs' order. A search that fails with an nnperf error fails the fit with it, as it
    would here; any other failure in a worker (an error that cannot travel back, a worker
    killed) reruns that search here, so the error, if it is one, is the search's own. Each
    search is a unit of ``nnperf.progress``.
    """
    method = method or start_method()
    progress.expect(len(jobs))
    if workers <= 1 or len(jobs) <= 1 or (method != "fork" and not _pickles(search, jobs)):
        return [_searched(search, *job) for job in jobs]
    order = sorted(range(len(jobs)), key=lambda i: not jobs[i][1].checkpoint)
    global _search, _jobs
    _search, _jobs = search, list(jobs)  # what forked workers inherit
    if method == "fork":
        # this process's objects (torch, a traced step) to the permanent generation: a forked
        # worker's collections never walk them again (a tenth of a trace's time otherwise)
        gc.freeze()
    try:
        # a forked worker has the search already; any other gets it pickled, once per worker
        return in_processes(_run, order, workers, method,
                            initializer=None if method == "fork" else _install,
                            initargs=() if method == "fork" else (search, list(jobs)),
                            rerun=lambda i: search(*jobs[i]))
    finally:
        _search, _jobs = None, []
        if method == "fork":
            gc.unfreeze()  # collectable here again (a notebook goes on working)


def in_processes(task: Callable[[int], T], order: list[int], workers: int, method: str, *,
                 initializer: Callable[..., None] | None = None, initargs: tuple[Any, ...] = (),
                 rerun: Callable[[int], T] | None = None) -> list[T]:
    """``[task(i) for i in range(len(order))]``, submitted in ``order`` to ``workers``
    processes started by ``method``; results in index order.

    An nnperf error in a task is raised at once (the other tasks stopped); any other failure
    is ``rerun(i)`` here, or raised where there is no ``rerun``. The wait wakes every tenth
    of a second: a Ctrl-C or SIGTERM is handled within that, and whatever ends the wait
    (those, an error) kills the workers before it goes on, so no worker outlives it or goes
    on tracing for minutes. Workers ignore Ctrl-C (the terminal sends it to them too: the
    parent decides), die of SIGTERM at once, and are killed when their parent dies
    (``_worker_setup``). Their ``nnperf.progress`` reports reach this process's sink.
    """
    context = _context(method)
    channel = context.Queue() if progress.watching() else None
    before = set(multiprocessing.active_children())
    results: dict[int, T] = {}
    failed: list[int] = []
    # a stop while the pool starts its processes and threads is held until they run, and
    # handled inside the ``try`` that kills the workers whatever ends it (``nnperf.stopping``)
    pool = None
    try:
        if method == "forkserver":
            _served(context)
        with stopping.held():
            pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_worker_setup,
                                       initargs=(channel, initializer, initargs))
            futures = {pool.submit(task, i): i for i in order}
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.1, return_when=FIRST_COMPLETED)
            stopping.handle_signals()
            if channel is not None:
                progress.drain(channel)
            for future in done:
                error = future.exception()
                if error is None:
                    results[futures[future]] = future.result()
                elif isinstance(error, NnperfError) or rerun is None:
                    raise error
                else:
                    failed.append(futures[future])
        pool.shutdown()
    except BaseException:
        with stopping.held():  # a second Ctrl-C waits for this
            _kill(set(multiprocessing.active_children()) - before)
            if pool is not None:
                # its workers killed, the pool's manager thread closes its wake-up pipe at once:
                # waited for here, because CPython 3.11's exit hook writes to that pipe without
                # the pool's lock, and one closing meanwhile printed a traceback as the CLI exited
                pool.shutdown(wait=True, cancel_futures=True)
        raise
    for i in failed:
        assert rerun is not None
        results[i] = rerun(i)
    return [results[i] for i in range(len(order))]


def _served(context: Any) -> None:
    """Wait until the fork server serves: it forks nothing before its preload (imports and a
    warm-up trace, seconds) is done, and a pool started meanwhile would wait for it with the
    stop signals held (``in_processes``). A process that does nothing, started here where a
    Ctrl-C or SIGTERM still stops the wait."""
    probe = context.Process(target=_nothing)
    probe.start()
    probe.join()


def _nothing() -> None:
    """What ``_served``'s process runs."""


def _kill(processes: set[Any]) -> None:
    """Kill the workers and reap them (a killed worker left unreaped is a zombie)."""
    for process in processes:
        process.kill()
    for process in processes:
        process.join(timeout=2)


def _worker_setup(channel: Any, initializer: Callable[..., None] | None, initargs: tuple[Any, ...]) -> None:
    """Every worker's start: Ctrl-C is the parent's to handle (it kills the workers), SIGTERM
    kills at once (the CLI's handler, inherited by a fork, would unwind Python first), the
    parent's death kills it too (Linux), its progress goes to the parent; then one intra-op
    thread and the caller's own set-up."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    stopping.release()  # a forked worker inherits them held
    stopping.die_with_parent()
    progress.to_queue(channel)
    one_thread()
    if initializer is not None:
        initializer(*initargs)


def _searched(search: Search, label: str, options: MemoryOptions) -> FitResult:
    """One search here, with its progress."""
    progress.note(label)
    result = search(label, options)
    progress.advance()
    return result


def _context(method: str) -> Any:
    context = multiprocessing.get_context(method)
    if method == "forkserver":
        # ignored once the server runs (a server someone else started: workers import more)
        context.set_forkserver_preload(FORKSERVER_PRELOAD)
        _start_servers()
    return context


def _start_servers() -> None:
    """Start the resource tracker and the fork server (fresh Pythons, not forks), or see that
    they run, with the stop signals blocked. The mask survives ``exec``: a terminal's Ctrl-C,
    sent to the whole foreground group, waits in them until they ignore it themselves, instead
    of interrupting their seconds of imports with a traceback over the command's line, and this
    process takes a Ctrl-C of those milliseconds as the block ends (it decides; they end with
    it). Two blocks: CPython's resource tracker (3.8 to 3.12, bpo-33613) unblocks SIGINT and
    SIGTERM as it returns from starting, so in one block the fork server would start taking
    them."""
    from multiprocessing import forkserver, resource_tracker

    with stopping.held():
        resource_tracker.ensure_running()
    with stopping.held():
        forkserver.ensure_running()


def _pickles(search: Search, jobs: list[Job]) -> bool:
    try:
        pickle.dumps((search, jobs))
    except Exception:  # pickle raises more than PicklingError (AttributeError, TypeError)
        return False
    return True


def one_thread() -> None:
    """A worker's set-up: one intra-op thread. A trace computes some values for real on
    the CPU (a mixture of experts' routing: ``histc``, ``argsort``), and OpenMP's thread team,
    once a parent has used it, hangs in a forked child (libgomp is not fork-safe: the child
    waits at a barrier for threads that were not forked); with one thread PyTorch runs such
    loops inline. Each worker has a core to itself anyway."""
    import torch

    torch.set_num_threads(1)


def _install(search: Search, jobs: list[Job]) -> None:
    """A worker's set-up where it did not inherit the search (any start method but fork)."""
    global _search, _jobs
    _search, _jobs = search, jobs


def _run(i: int) -> FitResult:
    """A worker's job: the ``i``-th search."""
    assert _search is not None
    return _searched(_search, *_jobs[i])
