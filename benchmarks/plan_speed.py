"""How long ``nnperf plan`` takes to search data, tensor and pipeline parallelism of a large
model on 1024 GPUs (target: under 60 s on 2 cores).

Two cases, each run in a fresh process as the CLI is:

- ``gpt3``: GPT-3 175B (the zoo's gpt2 scaled to 96 blocks of width 12288, 96 heads, Megatron-LM's
  51200-token vocabulary, 2048 tokens) on 1024 A100 80GB (128 DGX A100 nodes), a global batch of
  1536 sequences (Narayanan et al. 2021's 175B runs), bf16 autocast, AdamW; the data-parallel,
  tensor- and pipeline-parallel degrees all free (issue 37's target);
- ``llama70b``: a 70B-class Llama (80 blocks, width 8192, 64 query and 8 key/value heads, SwiGLU
  28672, vocabulary 128256) at 8192 tokens on 1024 H100s, a global batch of 1024 sequences.

Run: python benchmarks/plan_speed.py [--workers N] [--case gpt3|llama70b] (default: both).
Beside the wall time it prints the CPU seconds of the command and its workers (which other users
of the shared cores do not inflate) and how many rank roles the search traced.
"""

from __future__ import annotations

import json
import os
import sys

from _timed_cli import environment, run_nnperf

TARGET_S = 60.0
GPT3_175B = ["gpt2", "-O", "n_layer=96", "-O", "n_embd=12288", "-O", "n_head=96", "-O", "vocab=51200",
             "-O", "n_positions=2048", "--seq", "2048", "--amp", "bf16", "--gpu", "a100-80gb-sxm",
             "--cluster", "dgx-a100", "--gpus", "1024", "--global-batch", "1536"]
LLAMA_70B = ["llama-7b", "-O", "n_layer=80", "-O", "dim=8192", "-O", "n_heads=64", "-O", "n_kv_heads=8",
             "-O", "ffn_hidden=28672", "-O", "vocab=128256", "--seq", "8192", "--amp", "bf16", "--gpu", "h100",
             "--gpus", "1024", "--global-batch", "1024"]
CASES = {"gpt3": ("GPT-3 175B on 1024 x A100 80GB", GPT3_175B),
         "llama70b": ("70B-class llama on 1024 x H100", LLAMA_70B)}


def main() -> None:
    chosen = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--case=")]
    if "--case" in sys.argv:
        chosen.append(sys.argv[sys.argv.index("--case") + 1])
    sys.argv = [a for i, a in enumerate(sys.argv) if not (a.startswith("--case") or
                                                          (i and sys.argv[i - 1] == "--case"))]
    env = environment("NNPERF_PLAN_WORKERS")
    for name in chosen or list(CASES):
        title, case = CASES[name]
        done, took, cpu = run_nnperf(["plan", *case, "--json"], env)
        if done.returncode not in (0, 5):
            sys.exit(done.stderr[-2000:])
        doc = json.loads(done.stdout)
        best = doc["ranked"][0] if doc["ranked"] else None
        verdict = "ok" if took < TARGET_S else "OVER"
        print(f"plan {title}: {took:.1f} s (target < {TARGET_S:.0f} s) {verdict}; {cpu:.1f} CPU-s in all its "
              f"processes; {doc['traced_roles']} rank roles traced; {len(doc['ranked'])} layouts fit, "
              f"{len(doc['rejected'])} rejected; load average now {os.getloadavg()[0]:.2f}")
        if best:
            print(f"  best: {best['layout']}: step {best['step_time_s']:.2f} s, MFU {best['mfu']:.1%}, "
                  f"{best['memory_bytes'] / 2**30:.1f} GiB per GPU")


if __name__ == "__main__":
    main()
