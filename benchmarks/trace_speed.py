"""How fast nnperf traces and counts a step, beside bare FlopCounterMode on fake tensors.

Each case runs in a fresh subprocess so peak RSS (``resource.getrusage``) is that case's
alone. Prints the figures next to their targets; not a test (machine dependent).

    python benchmarks/trace_speed.py            # all cases
    python benchmarks/trace_speed.py --case llama-analyze
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

LLAMA = dict(model="llama-7b", batch=1, seq_len=4096, dtype="bf16", optimizer="adamw")
RESNET = dict(model="resnet50", batch=256, optimizer="adamw")

#: nnperf analyze over bare FlopCounterMode of the same step, timed in the same run (so
#: the load of the machine cancels out): the cost of recording everything it records.
MAX_RATIO = 1.5

CASES = {
    # name: (description, target seconds or None, target peak RSS GiB or None)
    "llama-analyze": ("nnperf analyze llama-7b b1 s4096 bf16 AdamW step", 10.0, 2.0),
    "llama-flopcounter": ("FlopCounterMode, fake tensors, same llama step (fwd+bwd+AdamW)", None, None),
    "resnet50-analyze": ("nnperf analyze resnet50 b256 AdamW step", 3.0, 2.0),
    "resnet50-flopcounter": ("FlopCounterMode, fake tensors, same resnet50 step", None, None),
}


def _analyze(cfg: dict) -> float:
    from nnperf.analysis import analyze

    cfg = dict(cfg)
    model = cfg.pop("model")
    start = time.perf_counter()
    a = analyze(model, **cfg)
    _ = a.totals, a.coverage  # the counting and roll-up a report needs
    return time.perf_counter() - start


def _flop_counter(cfg: dict) -> float:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    from nnperf.workload import default_loss
    from nnperf.zoo import get_model

    spec = get_model(cfg["model"])
    start = time.perf_counter()
    with FakeTensorMode():
        # built directly in bf16 (Module.to cannot swap fake parameters)
        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16 if cfg.get("dtype") == "bf16" else default)
        try:
            wl = spec.build(cfg["batch"], cfg.get("seq_len"))
        finally:
            torch.set_default_dtype(default)
        model = wl.model
        opt = torch.optim.AdamW(model.parameters(), foreach=True)
        with FlopCounterMode(display=False):
            out = model(*wl.inputs)
            (wl.loss_fn or default_loss)(out).backward()
            opt.step()
    return time.perf_counter() - start


def run_case(name: str) -> dict:
    import resource

    cfg = LLAMA if name.startswith("llama") else RESNET
    seconds = _analyze(cfg) if name.endswith("analyze") else _flop_counter(cfg)
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"case": name, "seconds": seconds, "peak_rss_gib": peak_kib / 2**20}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=list(CASES), action="append")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_case(args.child)))
        return 0
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    print(f"{'case':<22} {'seconds':>8} {'target':>7} {'peak RSS':>9} {'target':>7}  description")
    missed = 0
    seconds: dict[str, float] = {}
    for name in args.case or list(CASES):
        desc, t_target, m_target = CASES[name]
        proc = subprocess.run(
            [sys.executable, __file__, "--child", name], capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            print(f"{name:<22} FAILED\n{proc.stderr[-2000:]}")
            missed += 1
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        ok_t = t_target is None or r["seconds"] <= t_target
        ok_m = m_target is None or r["peak_rss_gib"] <= m_target
        missed += (not ok_t) + (not ok_m)
        t_txt = f"<={t_target:g}s" if t_target else "-"
        m_txt = f"<={m_target:g}G" if m_target else "-"
        flag = "" if ok_t and ok_m else "  MISSED"
        print(
            f"{name:<22} {r['seconds']:>8.2f} {t_txt:>7} {r['peak_rss_gib']:>7.2f}G {m_txt:>7}  "
            f"{desc}{flag}"
        )
        seconds[name] = r["seconds"]
    for model in ("llama", "resnet50"):
        ours, bare = seconds.get(f"{model}-analyze"), seconds.get(f"{model}-flopcounter")
        if ours and bare:
            ratio = ours / bare
            missed += model == "llama" and ratio > MAX_RATIO
            target = f"<={MAX_RATIO:g}x" if model == "llama" else "-"
            print(f"{model + ' ratio':<22} {ratio:>7.2f}x {target:>7}  analyze / FlopCounterMode")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
