"""How long ``nnperf advise`` takes for gpt2 and resnet50 (target: under 30 s each on 2 cores).

Run: python benchmarks/advise_speed.py [--workers N]. Each run is a fresh process, as the CLI
is (imports, fork server and worker start-up included). Beside the wall time it prints the CPU
seconds of the command and every process it started (workers included), which other users of
the shared cores do not inflate: on 2 free cores the wall time is about half of it."""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time

TARGET_S = 30.0
CASES = [
    ["gpt2", "--gpu", "a100", "--amp", "bf16"],
    ["resnet50", "--gpu", "a100", "--amp", "bf16"],
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=None, help="NNPERF_FIT_WORKERS for the searches")
    args = parser.parse_args()
    env = dict(os.environ)
    if args.workers:
        env["NNPERF_FIT_WORKERS"] = str(args.workers)
    print(f"cores available: {len(os.sched_getaffinity(0))}; load average before: "
          + ", ".join(f"{x:.2f}" for x in os.getloadavg()) + " (other users share the cores)")
    for case in CASES:
        start = time.perf_counter()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-c", "from nnperf.cli.app import main; main()", "advise", *case, "--json"], check=True,
                       stdout=subprocess.DEVNULL, env=env)
        took = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        verdict = "ok" if took < TARGET_S else "OVER"
        print(f"advise {' '.join(case)}: {took:.1f} s (target < {TARGET_S:.0f} s) {verdict}; "
              f"{cpu:.1f} CPU-s in all its processes; load average now {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
