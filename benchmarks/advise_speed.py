"""How long ``nnperf advise`` takes for gpt2 and resnet50 (target: under 30 s each on 2 cores).

Run: python benchmarks/advise_speed.py [--workers N]. Each run is a fresh process, as the CLI
is (imports, fork server and worker start-up included). Beside the wall time it prints the CPU
seconds of the command and every process it started (workers included), which other users of
the shared cores do not inflate: on 2 free cores the wall time is about half of it."""

from __future__ import annotations

import os
import sys

from _timed_cli import environment, run_nnperf

TARGET_S = 30.0
CASES = [
    ["gpt2", "--gpu", "a100", "--amp", "bf16"],
    ["resnet50", "--gpu", "a100", "--amp", "bf16"],
]


def main() -> None:
    env = environment("NNPERF_FIT_WORKERS")
    for case in CASES:
        done, took, cpu = run_nnperf(["advise", *case, "--json"], env)
        if done.returncode != 0:
            sys.exit(done.stderr[-2000:])
        verdict = "ok" if took < TARGET_S else "OVER"
        print(f"advise {' '.join(case)}: {took:.1f} s (target < {TARGET_S:.0f} s) {verdict}; "
              f"{cpu:.1f} CPU-s in all its processes; load average now {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
