"""Measure the validation configurations on this machine: one JSON line per finished run.

    python validation/run.py --out $OUT/records.jsonl --budget-s 540       # on a lent GPU
    python validation/run.py --plan [--gpu h100] [--only resnet50]         # estimates, no run
    python validation/run.py --device cpu --tiny --out /tmp/dry.jsonl      # dry run on a CPU
    python validation/run.py --fresh validation/fresh/frozen-2026-12-02.json --out ...  # the frozen set
    python validation/run.py --configs cnn-pairs --out ...                 # another list (see --help)

Configurations run most informative first (``nnperf.measure.validation_plan``: every model
family at its larger batch in bf16 training before anything else). Each finished
configuration is appended to ``--out`` as one JSON line and flushed, so a command stopped at
its time limit keeps everything it finished; a second run with the same ``--out`` skips what
is already there (``--redo`` runs it again). ``--budget-s`` stops starting configurations
whose estimated time no longer fits; ``--shard I/N`` splits the list across commands.

Each record holds the device (GPU name, driver, CUDA, cuDNN and torch versions), the date,
the library settings the step ran with (TF32 matmuls, ``torch.backends.cudnn.benchmark``),
the measured step time (median and spread, fastest as ``min``; with ``--back-to-back`` also
the step timed over back-to-back steps with the host's clock and one synchronize), per-module
measured times and the profiled time that could not be attributed (``unmatched_s``), peak
allocated and reserved memory (both read right after the timed steps) and the device's used
memory, nnperf's prediction (step time and peak memory) for the same configuration and, where
a GPU is present, PyTorch's own RuntimeEstimator prediction. A configuration predicted not to
fit is recorded as such without being run; one that runs out of memory is recorded with the
error.
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
from nnperf.measure.validation_plan import CONFIG_SETS, FIXED_S, Estimate, estimate, shard


def default_out() -> Path:
    """Under ``$OUT`` on the device machine (the only folder whose files come back)."""
    if os.environ.get("OUT"):
        return Path(os.environ["OUT"]) / "records.jsonl"
    return Path("validation/results/records.jsonl")


def cuda_memory_fields(m: Any, device: Any) -> dict[str, Any]:
    """The allocator's reserved peak of the measured steps (read by ``measure`` with the
    allocated peak, before anything reset it) and the device's used memory after the run (the
    CUDA context and library state live outside the allocator; ``nvidia-smi`` shows them)."""
    import torch

    if device.type != "cuda":
        return {}
    free, total = torch.cuda.mem_get_info(device)
    return {
        "measured_peak_reserved_bytes": m.peak_reserved_bytes,
        "device_used_bytes_after": int(total - free),
        "reserved_bytes_after": int(torch.cuda.memory_reserved(device)),
        "device_total_bytes": int(total),
    }


def attribution_fields(m: Any) -> dict[str, Any]:
    """What the profiler attributed and what it could not: ``unmatched_s`` (profiled op time
    on no traced op, and on a GPU kernels no op of the step launched), the profiled step, and
    on a GPU how the kernels were counted (kept, dropped by reason)."""
    a = m.alignment
    if a is None:
        return {"unmatched_s": None}
    doc = a.to_json()
    return {"unmatched_s": a.unmatched_s, "matched_s": a.matched_s, "profiled_step_s": m.profiled_step_s,
            "attributed_share_of_step": m.attributed_share_of_step,
            "profiler_only_s": doc["profiler_only"], "trace_only": doc["trace_only"], "kernels": doc["kernels"]}


def run_one(config: Config, device: Any, steps: int, warmup: int, gpu: Any, analysis: Any = None, *,
            back_to_back: bool = False, profile_ops: bool = True, profile_repeats: int = 3,
            runtime_estimator: bool = True) -> dict[str, Any]:
    """Measure ``config`` (traced already when ``analysis`` is given) and predict it."""
    from nnperf.measure.runner import measure, measured_by_module, predicted_peak_memory
    from nnperf.prediction import predict_analysis

    record: dict[str, Any] = {
        "schema": RECORD_SCHEMA, "config": config.name, "family": family_of(config.model),
        **config.to_json(),
    }
    try:
        m, analysis = measure(config.request(), config.trace_options(), device=device, steps=steps,
                              warmup=warmup, tf32=config.tf32, cudnn_benchmark=config.cudnn_benchmark,
                              profile_ops=profile_ops, profile_repeats=profile_repeats,
                              back_to_back=back_to_back, analysis=analysis)
    except ResourceError as err:
        record.update(error=str(err), fits=False)
        return record
    record.update(
        fits=True,
        environment=m.environment,
        device=m.device,
        device_name=m.device_name,
        measured_settings={"tf32_matmul": m.tf32, "cudnn_benchmark": m.cudnn_benchmark},
        measured_step_time_s=m.step.to_json(),
        measured_step_time_back_to_back_s=m.back_to_back_step_s,
        measured_peak_memory_bytes=m.peak_memory_bytes,
        memory_method=m.memory_method,
        predicted_peak_memory_bytes=predicted_peak_memory(analysis, str(device)),
        measured_modules_s=measured_by_module(m, analysis, depth=2) if m.alignment else None,
        **attribution_fields(m),
        **cuda_memory_fields(m, device),
    )
    if gpu is not None:
        p = predict_analysis(analysis, gpu, timing=config.timing_options())
        record.update(gpu=gpu.id, predicted_step_time_s=p.step.step_s,
                      predicted_device_total_bytes=p.memory.device_total,
                      predicted_modules_s={k: v.time_s for k, v in p.by_module(2).items()})
    if not runtime_estimator:
        return record
    try:
        record["runtime_estimator_step_time_s"] = runtime_estimator_s(config, str(device))
    except Exception as err:  # a private PyTorch API: record why it failed, keep going
        record["runtime_estimator_error"] = f"{type(err).__name__}: {err}"
    return record


def load_configs(args: argparse.Namespace) -> list[Config]:
    """The configurations to run: a frozen fresh set (``--fresh FILE``) or a named list
    (``--configs``), narrowed by ``--only`` and ``--shard``."""
    if args.fresh is not None:
        here = str(Path(__file__).resolve().parent)
        if here not in sys.path:  # imported as a module (the tests), not run as a script
            sys.path.insert(0, here)
        from fresh import load  # beside this script

        try:
            configs = load(args.fresh, tiny_configs=args.tiny)
        except (OSError, ValueError, KeyError) as err:
            raise ValueError(f"--fresh {args.fresh}: {err}") from None
    else:
        configs = CONFIG_SETS[args.configs](args.tiny)
    return shard(select(configs, args.only), args.shard)


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
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--configs", choices=sorted(CONFIG_SETS), default="zoo",
                        help="which list: the zoo (default), the CNN runs with cudnn.benchmark off and "
                             "on, the host-bound runs, the runs to profile again")
    source.add_argument("--fresh", type=Path, metavar="FILE",
                        help="the configurations a frozen file lists (validation/fresh.py)")
    parser.add_argument("--back-to-back", action="store_true",
                        help="also time --steps steps back to back (host clock, one synchronize)")
    parser.add_argument("--no-ops", dest="ops", action="store_false",
                        help="skip the profiled steps (no per-module times)")
    parser.add_argument("--profile-repeats", type=int, default=3,
                        help="profiled steps per configuration, each after a profiled warm-up (default 3: "
                             "the per-op median resists a stall)")
    parser.add_argument("--no-runtime-estimator", dest="runtime_estimator", action="store_false",
                        help="skip PyTorch's RuntimeEstimator prediction")
    args = parser.parse_args(argv)
    started = time.monotonic()
    if args.profile_repeats < 1:
        print(f"error: --profile-repeats {args.profile_repeats}: give 1 or more (--no-ops profiles nothing)",
              file=sys.stderr)
        return 2
    try:
        configs = load_configs(args)
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
        estimates = []
        for c in configs:
            try:
                estimates.append(estimate(c, gpu, plan_device, args.steps, args.warmup, args.back_to_back,
                                           args.profile_repeats if args.ops else 0))
            except Exception as err:  # the others are still worth a plan
                print(f"{c.name}: not traced, {type(err).__name__}: {str(err).splitlines()[0]}", file=sys.stderr)
        print_plan(estimates)
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
        try:
            est = estimate(config, gpu, plan_device, args.steps, args.warmup, args.back_to_back,
                           args.profile_repeats if args.ops else 0)
        except Exception as err:  # cannot be traced here (a library missing, say): say why, go on
            message = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            print(f"[{i}/{len(todo)}] {config.name}: not traced, {message}", flush=True)
            append(out, {"schema": RECORD_SCHEMA, "config": config.name, "family": family_of(config.model),
                         **config.to_json(), "error": message})
            continue
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
            record = run_one(config, device, args.steps, args.warmup, gpu, est.analysis,
                             back_to_back=args.back_to_back, profile_ops=args.ops,
                             profile_repeats=args.profile_repeats, runtime_estimator=args.runtime_estimator)
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
