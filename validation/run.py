"""Measure the validation configurations on this machine; one JSON record per run.

    python validation/run.py --out validation/results/h100 [--only gpt2 --only train-bf16]
                             [--device cuda] [--steps 20] [--warmup 5] [--list]

Each record holds the device (GPU name, driver, CUDA and torch versions), the date, the
measured step time (median and spread), per-module measured times, peak memory, nnperf's
prediction (step time and peak memory) for the same configuration and, where a GPU is present, PyTorch's own
RuntimeEstimator prediction. A configuration that does not fit is recorded as such.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path
from typing import Any

from nnperf.errors import NnperfError, ResourceError
from nnperf.measure.validation import (
    RECORD_SCHEMA,
    Config,
    default_configs,
    family_of,
    runtime_estimator_s,
    select,
)


def run_one(config: Config, device: Any, steps: int, warmup: int, gpu_name: str | None) -> dict[str, Any]:
    from nnperf.hardware import load_gpu
    from nnperf.measure.runner import measure, measured_by_module, predicted_peak_memory
    from nnperf.passes.timing import TimingOptions
    from nnperf.prediction import predict_analysis

    record: dict[str, Any] = {
        "schema": RECORD_SCHEMA, "config": config.name, "model": config.model, "family": family_of(config.model),
        "train": config.train, "precision": config.precision, "batch": config.batch, "seq": config.seq,
    }
    try:
        m, analysis = measure(config.request(), config.trace_options(), device=device, steps=steps,
                              warmup=warmup, tf32=config.tf32)
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
    )
    if gpu_name:
        gpu = load_gpu(gpu_name)
        p = predict_analysis(analysis, gpu, timing=TimingOptions(tf32_matmul=config.tf32))
        record.update(gpu=gpu.id, predicted_step_time_s=p.step.step_s,
                      predicted_modules_s={k: v.time_s for k, v in p.by_module(2).items()})
    try:
        record["runtime_estimator_step_time_s"] = runtime_estimator_s(config, str(device))
    except Exception as err:  # a private PyTorch API: record why it failed, keep going
        record["runtime_estimator_error"] = f"{type(err).__name__}: {err}"
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="validation/results", help="folder for the JSON records")
    parser.add_argument("--only", action="append", default=[], help="substring of config names (repeatable)")
    parser.add_argument("--device", default=None, help="cuda (default when present) or cpu")
    parser.add_argument("--gpu", default=None, help="catalog GPU to predict (default: matches the device)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--list", action="store_true", help="print the selected configurations and exit")
    args = parser.parse_args(argv)
    configs = select(default_configs(), args.only)
    if args.list:
        print("\n".join(c.name for c in configs))
        return 0
    import torch

    from nnperf.measure.device import resolve_device

    try:
        device = resolve_device(args.device)
    except NnperfError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    gpu_name = args.gpu or (torch.cuda.get_device_name(device) if device.type == "cuda" else None)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for i, config in enumerate(configs, 1):
        print(f"[{i}/{len(configs)}] {config.name}", flush=True)
        try:
            record = run_one(config, device, args.steps, args.warmup, gpu_name)
        except Exception as err:
            traceback.print_exc()
            record = {"schema": RECORD_SCHEMA, "config": config.name, "model": config.model,
                      "error": f"{type(err).__name__}: {err}"}
        (out / f"{config.name}.json").write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
