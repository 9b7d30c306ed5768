"""Measure the validation configurations on this machine: one JSON line per finished run.

    python validation/run.py --out $OUT/records.jsonl --budget-s 540       # on a lent GPU
    python validation/run.py --plan [--gpu h100] [--only resnet50]         # estimates, no run
    python validation/run.py --device cpu --tiny --out /tmp/dry.jsonl      # dry run on a CPU

Configurations run most informative first (``nnperf.measure.validation_plan``: every model
family at its larger batch in bf16 training before anything else). Each finished
configuration is appended to ``--out`` as one JSON line and flushed, so a command stopped at
its time limit keeps everything it finished; a second run with the same ``--out`` skips what
is already there (``--redo`` runs it again). ``--budget-s`` stops starting configurations
whose estimated time no longer fits; ``--shard I/N`` splits the list across commands.

Each record holds the device (GPU name, driver, CUDA, cuDNN and torch versions), the date,
the measured step time (median and spread), per-module measured times, peak allocated and
reserved memory and the device's used memory, nnperf's prediction (step time and peak
memory) for the same configuration and, where a GPU is present, PyTorch's own
RuntimeEstimator prediction. A configuration predicted not to fit is recorded as such
without being run; one that runs out of memory is recorded with the error.
"""

from __future__ import annotations

import os

os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # the profiler's USDT lines would fill the log

import argparse
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from nnperf.errors import NnperfError, ResourceError
from nnperf.measure.validation import (
    RECORD_SCHEMA,
    Config,
    family_of,
    load_records,
    runtime_estimator_s,
    select,
)
from nnperf.measure.validation_plan import FIXED_S, Estimate, estimate, ordered_configs, shard


def default_out() -> Path:
    """Under ``$OUT`` on the device machine (the only folder whose files come back)."""
    if os.environ.get("OUT"):
        return Path(os.environ["OUT"]) / "records.jsonl"
    return Path("validation/results/records.jsonl")


def cuda_memory_fields(device: Any) -> dict[str, Any]:
    """The allocator's reserved peak and the device's used memory (the CUDA context and
    library state live outside the allocator; ``nvidia-smi`` shows them)."""
    import torch

    if device.type != "cuda":
        return {}
    free, total = torch.cuda.mem_get_info(device)
    return {
        "measured_peak_reserved_bytes": int(torch.cuda.max_memory_reserved(device)),
        "device_used_bytes_after": int(total - free),
        "reserved_bytes_after": int(torch.cuda.memory_reserved(device)),
        "device_total_bytes": int(total),
    }


def run_one(config: Config, device: Any, steps: int, warmup: int, gpu: Any, analysis: Any = None) -> dict[str, Any]:
    """Measure ``config`` (traced already when ``analysis`` is given) and predict it."""
    from nnperf.measure.runner import measure, measured_by_module, predicted_peak_memory
    from nnperf.passes.timing import TimingOptions
    from nnperf.prediction import predict_analysis

    record: dict[str, Any] = {
        "schema": RECORD_SCHEMA, "config": config.name, "family": family_of(config.model),
        **config.to_json(),
    }
    try:
        m, analysis = measure(config.request(), config.trace_options(), device=device, steps=steps,
                              warmup=warmup, tf32=config.tf32, analysis=analysis)
    except ResourceError as err:
        record.update(error=str(err), fits=False)
        return record
    record.update(
        fits=True,
        environment=m.environment,
        device=m.device,
        device_name=m.device_name,
        measured_step_time_s=m.step.to_json(),
        measured_peak_memory_bytes=m.peak_memory_bytes,
        memory_method=m.memory_method,
        predicted_peak_memory_bytes=predicted_peak_memory(analysis, str(device)),
        measured_modules_s=measured_by_module(m, analysis, depth=2),
        attributed_share_of_step=m.attributed_share_of_step,
        **cuda_memory_fields(device),
    )
    if gpu is not None:
        p = predict_analysis(analysis, gpu, timing=TimingOptions(tf32_matmul=config.tf32))
        record.update(gpu=gpu.id, predicted_step_time_s=p.step.step_s,
                      predicted_device_total_bytes=p.memory.device_total,
                      predicted_modules_s={k: v.time_s for k, v in p.by_module(2).items()})
    try:
        record["runtime_estimator_step_time_s"] = runtime_estimator_s(config, str(device))
    except Exception as err:  # a private PyTorch API: record why it failed, keep going
        record["runtime_estimator_error"] = f"{type(err).__name__}: {err}"
    return record


def append(out: Path, record: dict[str, Any]) -> None:
    """One line, flushed and synced: a command killed after this keeps the record."""
    with out.open("a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def print_plan(estimates: list[Estimate]) -> None:
    total = 0.0
    print(f"{'configuration':<42}{'params':>14}{'pred. step':>12}{'fits':>6}{'est. s':>9}{'cum. s':>9}")
    for e in estimates:
        total += e.seconds if e.fits else 0.0
        step = f"{e.predicted_step_s * 1e3:.2f} ms" if e.predicted_step_s else "-"
        print(f"{e.config.name:<42}{e.params:>14,}{step:>12}{'yes' if e.fits else 'NO':>6}"
              f"{e.seconds if e.fits else 0.0:>9.1f}{total:>9.1f}")
    print(f"estimated device time: {total / 60:.1f} min for {sum(e.fits for e in estimates)} "
          f"configurations ({sum(not e.fits for e in estimates)} predicted not to fit, not run)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="JSON-lines file to append records to")
    parser.add_argument("--only", action="append", default=[],
                        help="model name, configuration glob or name prefix (repeatable)")
    parser.add_argument("--device", default=None, help="cuda (default when present) or cpu")
    parser.add_argument("--gpu", default=None, help="catalog GPU to predict (default: matches the device)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--budget-s", type=float, default=None, help="wall-clock budget of this command")
    parser.add_argument("--shard", default=None, help="I/N: every N-th configuration from the I-th")
    parser.add_argument("--tiny", action="store_true", help="CPU-sized models (a dry run of the plan)")
    parser.add_argument("--redo", action="store_true", help="run configurations already in --out again")
    parser.add_argument("--skip-done", action="append", default=[], type=Path,
                        help="also skip configurations recorded here (an earlier command's records)")
    parser.add_argument("--list", action="store_true", help="print the selected configurations and exit")
    parser.add_argument("--plan", action="store_true", help="print each configuration's estimate and exit")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        configs = shard(select(ordered_configs(tiny=args.tiny), args.only), args.shard)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.list:
        print("\n".join(c.name for c in configs))
        return 0
    import torch

    from nnperf.hardware import load_gpu
    from nnperf.measure.device import resolve_device

    try:
        device = torch.device("cpu") if args.plan and not args.device else resolve_device(args.device)
        gpu_name = args.gpu or (torch.cuda.get_device_name(device) if device.type == "cuda" else None)
        gpu = load_gpu(gpu_name) if gpu_name else None
    except NnperfError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    plan_device = "cuda" if (device.type == "cuda" or args.plan) and not args.tiny else "cpu"
    if args.plan:
        print_plan([estimate(c, gpu, plan_device, args.steps, args.warmup) for c in configs])
        return 0
    out = args.out or default_out()
    out.parent.mkdir(parents=True, exist_ok=True)
    earlier = [p for p in ([] if args.redo else [out, *args.skip_done]) if p.exists()]
    done = {r["config"] for p in earlier for r in load_records(p)}
    todo = [c for c in configs if c.name not in done]
    print(f"{len(configs)} configurations, {len(configs) - len(todo)} already in {out}", flush=True)
    for i, config in enumerate(todo, 1):
        left = None if args.budget_s is None else args.budget_s - (time.monotonic() - started)
        if left is not None and left < FIXED_S:
            print(f"budget spent: {len(todo) - i + 1} configurations left for the next command", flush=True)
            break
        est = estimate(config, gpu, plan_device, args.steps, args.warmup)
        left = None if args.budget_s is None else args.budget_s - (time.monotonic() - started)
        head = f"[{i}/{len(todo)}] {config.name} (est. {est.seconds:.0f} s)"
        if not est.fits:
            print(f"{head}: predicted not to fit on {gpu.name}, recorded, not run", flush=True)
            append(out, {"schema": RECORD_SCHEMA, "config": config.name, "family": family_of(config.model),
                         **config.to_json(), "fits": False, "skipped": "predicted not to fit",
                         "predicted_step_time_s": None, "gpu": gpu.id if gpu else None})
            continue
        if left is not None and est.seconds > left:
            print(f"{head}: skipped, {left:.0f} s of the budget left", flush=True)
            continue
        print(head, flush=True)
        t0 = time.monotonic()
        try:
            record = run_one(config, device, args.steps, args.warmup, gpu, est.analysis)
        except Exception as err:
            traceback.print_exc()
            record = {"schema": RECORD_SCHEMA, "config": config.name, **config.to_json(),
                      "error": f"{type(err).__name__}: {err}"}
        record["estimated_s"] = est.seconds
        record["wall_s"] = time.monotonic() - t0
        append(out, record)
    print(f"done in {time.monotonic() - started:.0f} s; records in {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
