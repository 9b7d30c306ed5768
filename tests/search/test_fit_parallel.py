"""Forked search workers (``search.fit_parallel``): a child forked after the parent used
OpenMP's thread team (a trace computes MoE routing for real on the CPU) must not hang in its
own first parallel loop; with ``one_thread`` as the pool's initializer it runs it inline."""

from __future__ import annotations

import multiprocessing
import sys

import pytest
import torch

from nnperf.search.fit_parallel import one_thread

pytestmark = [pytest.mark.process, pytest.mark.build]


def _histogram() -> list[float]:
    torch.manual_seed(0)
    return torch.histc(torch.randint(0, 8, (1 << 20,)).float(), bins=8, min=0, max=8).tolist()


@pytest.mark.skipif(not sys.platform.startswith("linux") or torch.get_num_threads() < 2,
                    reason="needs fork and an OpenMP team of 2 or more threads")
def test_a_worker_forked_after_openmp_runs_a_parallel_loop():
    expected = _histogram()  # the parent's OpenMP team is up now
    pool = multiprocessing.get_context("fork").Pool(1, initializer=one_thread)
    try:
        assert pool.apply_async(_histogram).get(timeout=60) == expected
    finally:
        pool.terminate()
        pool.join()


def test_a_later_search_never_ignores_ctrl_c(monkeypatch):
    """The fork server and the resource tracker are spawned with Ctrl-C ignored (their start
    would print tracebacks otherwise); once this process has started them, a later search
    spawns nothing and never sets SIGINT to be ignored, so a Ctrl-C then is always heard."""
    import signal

    from nnperf.search import fit_parallel

    fit_parallel._context("forkserver")
    ignored = []
    original = signal.signal

    def recording(signum, handler):
        if signum == signal.SIGINT and handler is signal.SIG_IGN:
            ignored.append(signum)
        return original(signum, handler)

    monkeypatch.setattr(signal, "signal", recording)
    fit_parallel._context("forkserver")
    assert ignored == []
