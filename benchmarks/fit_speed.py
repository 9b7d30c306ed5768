"""How long ``nnperf fit`` takes per model and what-if (traces and seconds).

Run: python benchmarks/fit_speed.py [MODEL ...] [--gpu a100-40gb]
The issue asks for the largest batch "in seconds"; this prints the wall time of each search.
"""

from __future__ import annotations

import argparse
import time

from nnperf.hardware import load_gpu
from nnperf.passes.fit import fit
from nnperf.passes.memory.tracing import MemoryOptions
from nnperf.request import ModelRequest


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("models", nargs="*", default=["mlp", "resnet50", "gpt2", "llama-7b"])
    parser.add_argument("--gpu", default="a100-40gb")
    parser.add_argument("--no-what-ifs", action="store_true")
    args = parser.parse_args()
    gpu = load_gpu(args.gpu)
    print(f"{'model':<12} {'what-if':<40} {'largest':>10} {'traces':>6} {'seconds':>8}")
    for name in args.models:
        start = time.perf_counter()
        for r in fit(ModelRequest(name), gpu, MemoryOptions(), include_what_ifs=not args.no_what_ifs):
            largest = "none" if r.largest is None else (">=" if r.capped else "") + str(r.largest)
            print(f"{name:<12} {r.label:<40} {largest:>10} {len(r.probes):>6} {r.seconds:>8.1f}")
        print(f"{name:<12} {'(all what-ifs)':<40} {'':>10} {'':>6} {time.perf_counter() - start:>8.1f}")


if __name__ == "__main__":
    main()
