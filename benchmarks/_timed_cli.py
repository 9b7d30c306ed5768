"""Shared by the benchmarks that time an ``nnperf`` command in a fresh process, as the CLI
runs: the worker-count option, the machine's load, and wall plus CPU seconds of the command
and every process it started (which other users of shared cores do not inflate)."""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time


def environment(workers_variable: str) -> dict[str, str]:
    """The environment for the command, with ``--workers N`` set as ``workers_variable``;
    prints the cores and the load average before the run."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=None, help=f"{workers_variable} for the searches")
    args = parser.parse_args()
    env = dict(os.environ)
    if args.workers:
        env[workers_variable] = str(args.workers)
    print(f"cores available: {len(os.sched_getaffinity(0))}; load average before: "
          + ", ".join(f"{x:.2f}" for x in os.getloadavg()) + " (other users share the cores)")
    return env


def run_nnperf(args: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess, float, float]:
    """``nnperf ARGS`` in a fresh process: its result (stdout captured), wall and CPU seconds."""
    start = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-c", "from nnperf.cli.app import main; main()", *args],
                          check=False, capture_output=True, text=True, env=env)
    took = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return done, took, cpu
