"""How long ``nnperf plan`` takes for a 70B-class Llama on 1024 H100s (target: under 60 s on
2 cores).

The model is the zoo's llama scaled to Llama-3-70B's shape with -O overrides (80 blocks, width
8192, 64 query and 8 key/value heads, SwiGLU 28672, vocabulary 128256), 8192 tokens per
sequence, bf16 autocast, AdamW, a global batch of 1024 sequences on 128 DGX H100 nodes. Run:
python benchmarks/plan_speed.py [--workers N]; each run is a fresh process, as the CLI is.
Beside the wall time it prints the CPU seconds of the command and its workers (which other users
of the shared cores do not inflate) and how many rank roles the search traced.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

TARGET_S = 60.0
LLAMA_70B = ["-O", "n_layer=80", "-O", "dim=8192", "-O", "n_heads=64", "-O", "n_kv_heads=8",
             "-O", "ffn_hidden=28672", "-O", "vocab=128256"]
CASE = ["llama-7b", *LLAMA_70B, "--seq", "8192", "--batch", "1", "--amp", "bf16", "--gpu", "h100",
        "--gpus", "1024", "--global-batch", "1024"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=None, help="NNPERF_PLAN_WORKERS for the search")
    args = parser.parse_args()
    env = dict(os.environ)
    if args.workers:
        env["NNPERF_PLAN_WORKERS"] = str(args.workers)
    print(f"cores available: {len(os.sched_getaffinity(0))}; load average before: "
          + ", ".join(f"{x:.2f}" for x in os.getloadavg()) + " (other users share the cores)")
    start = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-c", "from nnperf.cli.app import main; main()", "plan", *CASE, "--json"],
                          check=False, capture_output=True, text=True, env=env)
    took = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode not in (0, 5):
        sys.exit(done.stderr[-2000:])
    doc = json.loads(done.stdout)
    best = doc["ranked"][0] if doc["ranked"] else None
    verdict = "ok" if took < TARGET_S else "OVER"
    print(f"plan 70B-class llama on 1024 x H100: {took:.1f} s (target < {TARGET_S:.0f} s) {verdict}; "
          f"{cpu:.1f} CPU-s in all its processes; {doc['traced_roles']} rank roles traced; "
          f"{len(doc['ranked'])} layouts fit, {len(doc['rejected'])} rejected; load average now {os.getloadavg()[0]:.2f}")
    if best:
        print(f"best: {best['layout']}: step {best['step_time_s']:.2f} s, MFU {best['mfu']:.1%}, "
              f"{best['memory_bytes'] / 2**30:.1f} GiB per GPU")


if __name__ == "__main__":
    main()
