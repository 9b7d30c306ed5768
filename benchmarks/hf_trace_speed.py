"""How fast nnperf analyzes a 7B-class Hugging Face model's training step, beside bare
FlopCounterMode over the same model.

The model is ``hf:meta-llama/Llama-3.1-8B`` (the config nnperf ships; transformers builds it
from the config, no weights), batch 1 x 4096 tokens, bf16 weights, AdamW. Two baselines:

- ``flopcounter-meta``: FlopCounterMode over forward and backward on the meta device, the
  issue's yardstick (issue 16: nnperf in at most 1.5x its time, under 2 GB);
- ``flopcounter-fake``: FlopCounterMode over forward, backward and the AdamW step on fake
  tensors, the yardstick of ``trace_speed.py`` (the same step nnperf records, on the tensors
  it records on). Fake tensors cost Python dispatch (and a cache keyed on every argument) per
  op where meta tensors run C++ shape functions, so this one bounds what a fake-tensor trace
  can reach.

Each case runs in a fresh subprocess, so its peak RSS (``resource.getrusage``) is its own;
each times reading the config, building the model and the step, after importing torch and
transformers' modules. Prints
the figures next to their targets; not a test (machine dependent). Needs transformers.

    python benchmarks/hf_trace_speed.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

MODEL = "meta-llama/Llama-3.1-8B"
BATCH, SEQ = 1, 4096

#: nnperf analyze over bare FlopCounterMode, timed in the same run (the machine's load
#: cancels out), and the peak RSS of the analysis.
MAX_RATIO = 1.5
MAX_RSS_GIB = 2.0

CASES = {
    "analyze": "nnperf analyze hf:Llama-3.1-8B b1 s4096 bf16 AdamW step (build + trace + count)",
    "flopcounter-meta": "FlopCounterMode, meta device, same model: build + forward + backward",
    "flopcounter-fake": "FlopCounterMode, fake tensors, same model: build + fwd + bwd + AdamW",
}


def _import_library() -> None:
    """transformers' lazy modules, imported before the clock in every case (a one-time cost of
    the library, about 2 s here, that is no part of tracing)."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    _ = CONFIG_MAPPING["llama"], transformers.AutoModelForCausalLM, transformers.LlamaForCausalLM


def _analyze() -> tuple[float, dict]:
    from nnperf.analysis import analyze

    start = time.perf_counter()
    a = analyze(f"hf:{MODEL}", batch=BATCH, seq_len=SEQ, dtype="bf16", optimizer="adamw")
    totals, coverage = a.totals, a.coverage  # the counting and roll-up a report needs
    seconds = time.perf_counter() - start
    return seconds, {"params": totals["params"], "flops": totals["flops"],
                     "op_share": coverage["op_share"], "ops": totals["ops"]}


def _flop_counter(fake: bool) -> tuple[float, dict]:
    import torch
    import transformers
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    from nnperf.hub.hf_config import from_dict, shipped

    start = time.perf_counter()  # from the config on, as nnperf's time
    config = from_dict(shipped()[MODEL.lower()].load(), MODEL, transformers)
    with FakeTensorMode() if fake else torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        ids = torch.randint(0, config.vocab_size, (BATCH, SEQ))
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), foreach=True) if fake else None
        with FlopCounterMode(display=False) as counter:
            model(input_ids=ids, labels=ids).loss.backward()
            if optimizer is not None:
                optimizer.step()
    seconds = time.perf_counter() - start
    return seconds, {"flops": counter.get_total_flops()}


def run_case(name: str) -> dict:
    import resource

    _import_library()
    seconds, extra = _analyze() if name == "analyze" else _flop_counter(name.endswith("fake"))
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"case": name, "seconds": seconds, "peak_rss_gib": peak_kib / 2**20, **extra}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_case(args.child)))
        return 0
    import torch
    import transformers

    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, transformers "
          f"{transformers.__version__}, {os.cpu_count()} CPUs")
    results: dict[str, dict] = {}
    for name, desc in CASES.items():
        proc = subprocess.run([sys.executable, __file__, "--child", name], capture_output=True,
                              text=True, check=False)
        if proc.returncode != 0:
            print(f"{name:<12} FAILED\n{proc.stderr[-2000:]}")
            return 1
        results[name] = r = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"{name:<17} {r['seconds']:>6.2f} s {r['peak_rss_gib']:>6.2f} GiB peak RSS  {desc}")
    ours = results["analyze"]
    missed = 0
    for base in ("flopcounter-meta", "flopcounter-fake"):
        ratio = ours["seconds"] / results[base]["seconds"]
        ok = ratio <= MAX_RATIO
        missed += not ok
        print(f"analyze / {base[12:]:<6} {ratio:>5.2f} x  (target <= {MAX_RATIO:g}x)"
              f"{'' if ok else '  MISSED'}")
    ok_rss = ours["peak_rss_gib"] < MAX_RSS_GIB
    print(f"peak RSS          {ours['peak_rss_gib']:>5.2f} GiB (target < {MAX_RSS_GIB:g} GiB)"
          f"{'' if ok_rss else '  MISSED'}")
    print(f"analysis: {ours['params']:,} parameters, {ours['flops']:.4g} FLOPs, {ours['ops']:,} ops, "
          f"{ours['op_share']:.1%} covered")
    return 0 if not missed and ok_rss else 1


if __name__ == "__main__":
    sys.exit(main())
