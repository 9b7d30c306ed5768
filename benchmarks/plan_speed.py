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

import json
import os
import sys

from _timed_cli import environment, run_nnperf

TARGET_S = 60.0
LLAMA_70B = ["-O", "n_layer=80", "-O", "dim=8192", "-O", "n_heads=64", "-O", "n_kv_heads=8",
             "-O", "ffn_hidden=28672", "-O", "vocab=128256"]
CASE = ["llama-7b", *LLAMA_70B, "--seq", "8192", "--amp", "bf16", "--gpu", "h100",
        "--gpus", "1024", "--global-batch", "1024"]


def main() -> None:
    env = environment("NNPERF_PLAN_WORKERS")
    done, took, cpu = run_nnperf(["plan", *CASE, "--json"], env)
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
