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


#: Starts a search in fork-server workers in a fresh process (so the resource tracker and the
#: fork server are spawned), sends this process a Ctrl-C just after the spawn numbered by
#: argv[1] (0: the tracker, 1: the server), and prints, for each program spawned, whether it
#: started with SIGINT blocked, then how the search ended.
CTRL_C_AT_SPAWN = """
import os, signal, sys
from multiprocessing import util
from nnperf.search import fit_parallel

signal.signal(signal.SIGINT, signal.default_int_handler)  # as the CLI does
spawn, at = util.spawnv_passfds, int(sys.argv[1])
spawned = []

def sigint_blocked(pid):
    status = open(f"/proc/{pid}/status").read()
    mask = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigBlk:")), 16)
    return bool(mask >> (signal.SIGINT - 1) & 1)

def spawn_then_ctrl_c(path, args, fds):
    pid = spawn(path, args, fds)
    print("blocked" if sigint_blocked(pid) else "taking", flush=True)
    if len(spawned) == at:
        os.kill(os.getpid(), signal.SIGINT)
    spawned.append(pid)
    return pid

util.spawnv_passfds = spawn_then_ctrl_c
try:
    fit_parallel.in_processes(abs, [0, 1], 2, "forkserver")
    print("finished")
except KeyboardInterrupt:
    print("interrupted")
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; fork servers serve searches on Linux")
@pytest.mark.parametrize("at, spawned", [(0, ["blocked"]), (1, ["blocked", "blocked"])],
                         ids=["resource-tracker", "fork-server"])
def test_a_ctrl_c_while_the_servers_start_is_heard_and_they_start_deaf_to_it(at, spawned):
    """The fork server imports for seconds before it ignores SIGINT, and a terminal's Ctrl-C
    signals the whole group: started with SIGINT blocked, it never prints a traceback. The
    command's own Ctrl-C in those milliseconds stops it (the Ctrl-C after the tracker's spawn
    also stops the search before the server's)."""
    import subprocess

    out = subprocess.run([sys.executable, "-c", CTRL_C_AT_SPAWN, str(at)], capture_output=True, text=True,
                         timeout=240)
    assert out.stdout.split() == [*spawned, "interrupted"], out.stdout + out.stderr


#: Prepares searches that a backward here precedes (advise), then says whether a fork server
#: runs and whether a fork is still safe once the tracer's own backward has run (the autograd
#: threads take their names a moment after it returns: looked for over a second).
PREPARED = """
import time
from pathlib import Path
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from nnperf.search import fit_parallel

fit_parallel.prepare(2, backward_first=True)


def fork_server_runs():  # a child that has not yet exec'd still shows this process's command line
    children = Path("/proc/self/task").glob("*/children")
    pids = [pid for task in children for pid in task.read_text().split()]
    return any(b"forkserver import main" in Path(f"/proc/{pid}/cmdline").read_bytes() for pid in pids)


deadline = time.monotonic() + 2
while not fork_server_runs() and time.monotonic() < deadline:
    time.sleep(0.01)
serving = fork_server_runs()
with FakeTensorMode():  # a trace's backward
    w = torch.ones(4, requires_grad=True)
    (w.to(torch.bfloat16) * 2).sum().backward()
deadline = time.monotonic() + 1
while fit_parallel.fork_is_safe() and time.monotonic() < deadline:
    time.sleep(0.01)
print(serving, fit_parallel.fork_is_safe())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; fork servers serve searches on Linux")
def test_a_fork_server_starts_before_the_backward_that_rules_out_forking():
    """On a CUDA build a trace's backward starts autograd's device threads, after which
    advise's searches need a fork server: prepared before that backward, it runs already (its
    seconds of imports overlap the trace); on a CPU build none starts and forking stays safe."""
    import subprocess

    out = subprocess.run([sys.executable, "-c", PREPARED], capture_output=True, text=True, timeout=240)
    serving, fork_safe = out.stdout.split()
    assert serving == str(fork_safe == "False"), out.stdout + out.stderr
