"""The host memory one module and one traced op cost: the source of ``trace.limits``'s
``BYTES_PER_MODULE`` and ``BYTES_PER_TRACED_OP``.

Each figure is a slope between two sizes of the same model, so what every run pays once
(Python, torch, nnperf's imports) cancels out:

- per module built: a GPT-2 of 100 and of 2000 blocks (d=64) built on the meta device, the
  growth of this process's resident memory over the modules added;
- per traced op: ``nnperf analyze gpt2 -O n_embd=64`` at 200 and 800 blocks, each in a fresh
  process, the growth of its peak RSS (``resource.getrusage``) over the ops it recorded;
- per module built and traced: the first plus the second times GPT-2's traced ops per module.

    python benchmarks/trace_host_memory.py

Measured on the 2-core AMD EPYC VM, torch 2.13.0+cpu, two runs: 2.9-3.0 KiB per module built,
7.5-7.7 KiB per traced op, 5.2 ops per module; ``trace.limits`` rounds to 8 KiB per op and
3 + 5.2 x 8 = 45 KiB per module built and traced.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys

SMALL = ["-O", "n_embd=64", "-O", "n_head=2", "-O", "vocab=128", "--seq", "16", "--batch", "1"]


def _resident() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize()


def per_module_built() -> float:
    import torch

    from nnperf.zoo import get_model

    spec = get_model("gpt2")
    kept, points = [], []  # every model kept alive, so no build reuses another's freed memory
    for blocks in (10, 100, 2000):  # the first warms up what a first build loads
        before = _resident()
        with torch.device("meta"):
            kept.append(spec.build(1, 16, n_layer=blocks, n_embd=64, n_head=2, vocab=128))
        points.append((sum(1 for _ in kept[-1].model.modules()), _resident() - before))
    (m0, b0), (m1, b1) = points[1:]
    return (b1 - b0) / (m1 - m0)


def _analyze(blocks: int) -> tuple[int, int, int]:
    """(peak RSS bytes, ops, modules) of ``nnperf analyze`` of GPT-2 with ``blocks`` blocks."""
    code = ("import json, resource; from nnperf.analysis import analyze; "
            f"a = analyze('gpt2', n_layer={blocks}, n_embd=64, n_head=2, vocab=128, seq_len=16, batch=1); "
            "print(json.dumps([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "
            "a.totals['ops'], len(a.trace.module_types)]))")
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return tuple(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    module = per_module_built()
    (r0, o0, m0), (r1, o1, m1) = _analyze(200), _analyze(800)
    op = (r1 - r0) / (o1 - o0)
    ops_per_module = (o1 - o0) / (m1 - m0)
    print(f"per module built (meta):        {module / 1024:6.1f} KiB")
    print(f"per traced op (analyze passes): {op / 1024:6.1f} KiB   (trace.limits: 8 KiB)")
    print(f"traced ops per module (gpt2):   {ops_per_module:6.1f}")
    print(f"per module built and traced:    {(module + ops_per_module * op) / 1024:6.1f} KiB   "
          "(trace.limits: 45 KiB)")


if __name__ == "__main__":
    main()
