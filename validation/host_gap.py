"""Where an eager step's host time goes on a GPU's host, beyond the parts nnperf adds up.

    python validation/host_gap.py --device cuda --out host-gap.json      # on a lent GPU (~3 min)
    python validation/host_gap.py --device cpu --dry-run --out x.json    # every code path, tiny

The H200 runs' host-bound steps (mlp, mnist, BERT at small batches) took about twice the host
time ``passes.host_time`` adds up from the parts ``measure.calibration.host_parts`` measured on
the same VM. A diagnosis, not a source of constants (whole-model timings stay the test set):

1. ``ops``: one op's host issue time in a tight loop, on tiny tensors and on real-sized ones
   (a GEMM's library call may choose its algorithm by shape; the caching allocator serves
   larger, varied blocks), fewer calls between syncs than the launch queue holds, so the
   host never waits for the device.
2. ``phases``: real steps with a watch on their parts (forward, loss, backward, optimizer,
   zero_grad), host clock only, and the whole step with Python's garbage collector on and off.
3. ``profiles``: the profiler's CPU self time per op and per CUDA runtime call over a few
   steps of two host-bound workloads (the profiler slows the host, so shares, not seconds).

Everything is written to ``--out`` after each part (a stopped run keeps what it measured).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from nnperf.loading import resolve
from nnperf.measure.runner import environment
from nnperf.measure.step import build_step
from nnperf.measure.validation import Config
from nnperf.measure.validation_plan import TINY
from nnperf.trace.step import StepWatch

#: Real steps timed by phase: host-bound ones on the H200's VM, and one device-bound CNN.
WORKLOADS = (
    Config("mlp", True, "bf16", 1024), Config("mnist-cnn", True, "bf16", 512),
    Config("bert-base", True, "bf16", 32), Config("bert-base", False, "bf16", 1),
    Config("resnet50", True, "bf16", 64),
)
PROFILED = (Config("mlp", True, "bf16", 1024), Config("bert-base", False, "bf16", 1))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def issue_times(fn: Callable[[], object], device: torch.device, calls: int, loops: int) -> list[float]:
    """Host seconds per call of ``fn``, ``calls`` calls per loop, the device drained between
    loops (fewer launches than the queue holds: the host never waits)."""
    for _ in range(3):
        fn()
    _sync(device)
    out = []
    for _ in range(loops):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - start) / calls)
        _sync(device)
    return out


def op_cases(device: torch.device, tiny: bool) -> dict[str, Callable[[], object]]:
    """Each op on tiny tensors and on the sizes the host-bound steps run."""
    bf16 = torch.bfloat16
    real = 64 if tiny else 1024
    cases: dict[str, Callable[[], object]] = {}
    for size_name, rows, width in (("tiny", 8, 8), ("real", real, real)):
        a = torch.randn(rows, width, device=device)
        b = torch.randn(rows, width, device=device)
        ab, wb, bias = a.to(bf16), torch.randn(width, width, device=device, dtype=bf16), torch.randn(width, device=device, dtype=bf16)
        image = torch.randn(2 if size_name == "tiny" else 32, 16 if size_name == "tiny" else 64, 8 if size_name == "tiny" else 28,
                            8 if size_name == "tiny" else 28, device=device, dtype=bf16)
        kernel = torch.randn(image.shape[1], image.shape[1], 3, 3, device=device, dtype=bf16)
        gamma, beta = torch.ones(image.shape[1], device=device), torch.zeros(image.shape[1], device=device)
        mean, var = torch.zeros(image.shape[1], device=device), torch.ones(image.shape[1], device=device)
        target = torch.zeros(rows, dtype=torch.long, device=device)
        leaf = torch.randn(rows, width, device=device, requires_grad=True)
        cases.update({
            f"add/{size_name}": lambda a=a, b=b: torch.add(a, b),
            f"relu/{size_name}": lambda a=a: torch.relu(a),
            f"to_bf16/{size_name}": lambda a=a: a.to(bf16),
            f"mm_bf16/{size_name}": lambda ab=ab, wb=wb: torch.mm(ab, wb),
            f"linear_bias_bf16/{size_name}": lambda ab=ab, wb=wb, bias=bias: F.linear(ab, wb, bias),
            f"linear_bf16/{size_name}": lambda ab=ab, wb=wb: F.linear(ab, wb),
            f"layer_norm/{size_name}": lambda a=a: F.layer_norm(a, (a.shape[1],)),
            f"softmax/{size_name}": lambda a=a: torch.softmax(a, -1),
            f"cross_entropy/{size_name}": lambda a=a, t=target: F.cross_entropy(a, t),
            f"conv3x3_bf16/{size_name}": lambda x=image, k=kernel: F.conv2d(x, k, padding=1),
            f"batch_norm_train/{size_name}": lambda x=image, g=gamma, be=beta, m=mean, v=var:
                F.batch_norm(x, m, v, g, be, training=True),
            f"add_recorded/{size_name}": lambda leaf=leaf, b=b: torch.add(leaf, b),
            f"mul_saving/{size_name}": lambda leaf=leaf, b=b: torch.mul(leaf, b),
        })
    return cases


def measure_ops(device: torch.device, dry: bool) -> dict[str, Any]:
    out = {}
    calls, loops = (5, 2) if dry else (200, 9)
    for name, fn in op_cases(device, dry).items():
        samples = issue_times(fn, device, calls, loops)
        out[name] = {"min_s": min(samples), "median_s": statistics.median(samples)}
    return out


class PhaseWatch(StepWatch):
    """Host clock at each part of a step (no device sync: a host-bound step's queue is short)."""

    def __init__(self) -> None:
        self.marks: list[tuple[str, float]] = []

    def mark(self, what: str) -> None:
        self.marks.append((what, time.perf_counter()))

    def loss_starts(self) -> None: self.mark("loss")
    def backward_starts(self, loss: torch.Tensor) -> None: self.mark("backward")
    def backward_ends(self) -> None: self.mark("after_backward")
    def optimizer_starts(self) -> None: self.mark("optimizer")
    def optimizer_ends(self) -> None: self.mark("zero_grad")


def time_phases(run: Callable[..., Any], device: torch.device, steps: int) -> dict[str, Any]:
    """Per part of the step, the median host seconds over ``steps`` steps, each started on an
    idle device; the whole step's host time with the garbage collector on and off."""
    parts: dict[str, list[float]] = {}
    whole: list[float] = []
    for _ in range(steps):
        _sync(device)
        watch = PhaseWatch()
        watch.mark("forward")
        run(watch)
        watch.mark("end")
        whole.append(watch.marks[-1][1] - watch.marks[0][1])
        for (name, start), (_, end) in zip(watch.marks, watch.marks[1:], strict=False):
            parts.setdefault(name, []).append(end - start)
    _sync(device)
    gc.disable()
    try:
        no_gc = []
        for _ in range(steps):
            _sync(device)
            start = time.perf_counter()
            run(StepWatch())
            no_gc.append(time.perf_counter() - start)
    finally:
        gc.enable()
    _sync(device)
    return {"host_s": statistics.median(whole), "host_no_gc_s": statistics.median(no_gc),
            "parts_s": {k: statistics.median(v) for k, v in parts.items()}}


def _built(config: Config, device: torch.device, dry: bool) -> tuple[Config, Any]:
    if dry:  # the CPU-sized version the harness's dry run uses
        batches, seq, overrides = TINY[config.model]
        config = Config(config.model, config.train, config.precision, batches[0], seq,
                        tuple(sorted(overrides.items())), tiny=True)
    _, build = resolve(config.request())
    return config, build_step(build, config.trace_options(), device)


def measure_phases(device: torch.device, dry: bool) -> dict[str, Any]:
    out = {}
    for config in WORKLOADS:
        config, step = _built(config, device, dry)
        for _ in range(2 if dry else 5):
            step.step.run()
        _sync(device)
        out[config.name] = time_phases(step.step.run, device, 2 if dry else 30)
        del step
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out


def measure_profiles(device: torch.device, dry: bool) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    out = {}
    for config in PROFILED:
        config, step = _built(config, device, dry)
        for _ in range(3):
            step.step.run()
        _sync(device)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        steps = 2 if dry else 5
        with profile(activities=activities) as prof:
            for _ in range(steps):
                step.step.run()
            _sync(device)
        rows = [{"name": e.key, "count": e.count / steps, "cpu_self_s": e.self_cpu_time_total / 1e6 / steps,
                 "cpu_total_s": e.cpu_time_total / 1e6 / steps}
                for e in prof.key_averages()]
        rows.sort(key=lambda r: -r["cpu_self_s"])
        out[config.name] = {"steps": steps, "rows": rows[:80],
                            "cpu_self_all_s": sum(r["cpu_self_s"] for r in rows)}
        del step, prof
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes and few calls: every code path")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    doc: dict[str, Any] = {"schema": "nnperf.host_gap/1", "environment": environment(device)}

    def save() -> None:
        tmp = args.out.with_name(args.out.name + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        os.replace(tmp, args.out)

    started = time.perf_counter()
    for name, part in (("ops", measure_ops), ("phases", measure_phases), ("profiles", measure_profiles)):
        try:
            doc[name] = part(device, args.dry_run)
        except Exception as err:  # keep what the other parts measure
            doc[name] = {"error": f"{type(err).__name__}: {err}"}
        print(f"host_gap: {name} done at {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
        save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
