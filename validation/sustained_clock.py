"""The SM clock a Hopper GPU holds under a training step's mix, beside back-to-back GEMMs.

    python validation/sustained_clock.py --device cuda --out $OUT/sustained-clock.json   # ~45 s
    python validation/sustained_clock.py --device cpu --out /tmp/sustained-clock.json    # dry run

Why: the H200's second run held 1470 MHz under back-to-back bf16 8192^3 GEMMs (its 700 W cap;
``hardware/gpus/h200-sxm.toml`` scales its peaks to that clock), and the H100 SXM entry, the same
die under the same cap, keeps its datasheet clock. Published H100 training runs in BF16 come
out 9-22% faster than measured (``validation/multi_gpu/dgxc_runs.toml``) and with the H200's
clock they would land at +4%, but their FP8 runs at +9%: whether a real step, whose GEMMs
alternate with attention, norms, the optimizer and memory-bound kernels, draws the clock down as
far as pure GEMMs do, and whether FP8 GEMMs run hotter or cooler than bf16 ones, is what decides
it. A diagnosis of the clock, not a constant fitted to a step: each load is timed and its clock
read, nothing else.

Each load runs back to back for ``--seconds`` after a warm-up, in batches; after each batch is
queued the SM clock, the board power and the temperature are read (NVML through torch), and the
batch's device time is taken with CUDA events. A row per load: every sample, and the medians of
the first second against the last half of the run.

1. ``gemm-bf16``: torch.mm of two random 8192 x 8192 bf16 matrices (the second run's load);
2. ``gemm-fp8``: torch._scaled_mm of random float8_e4m3fn 8192 x 8192 operands with per-tensor
   scales into bf16 (skipped, with the reason, on a GPU without FP8 tensor cores);
3. ``step-bf16``: nnperf's own measured step (``measure.step.build_step``) of the built-in
   llama-7b at Llama 3 8B's width and 4 blocks (dim 4096, 32 heads, 8 key/value heads, FFN
   14336, vocabulary 32000), one sequence of 4096 tokens, bf16 weights, fused AdamW: forward,
   backward and optimizer, as ``nnperf predict llama-7b -O n_layer=4 -O dim=4096 -O n_heads=32
   -O n_kv_heads=8 -O ffn_hidden=14336 -O vocab=32000 --batch 1 --seq 4096 --dtype bf16
   --optimizer-impl fused --gpu h200`` predicts it.

The JSON is rewritten whole after every row (``cli.paths.atomic_path``: a temporary file renamed
into place, removed if the run is stopped). ``--device cpu`` runs every path with tiny sizes
and no clock (``tests/measure/test_sustained_clock_script.py``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from nnperf.cli.paths import atomic_path
from nnperf.loading import resolve
from nnperf.measure.calibration.host_info import sm_clock_mhz
from nnperf.measure.device import resolve_device, synchronize
from nnperf.measure.runner import environment
from nnperf.measure.step import build_step
from nnperf.request import ModelRequest
from nnperf.trace.options import TraceOptions

SCHEMA = "nnperf.sustained_clock/1"
#: Llama 3 8B's block, four of them, under nnperf's built-in llama-7b.
STEP_MODEL = {"n_layer": 4, "dim": 4096, "n_heads": 32, "n_kv_heads": 8, "ffn_hidden": 14336, "vocab": 32000}
TINY_MODEL = {"n_layer": 2, "dim": 64, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 128, "vocab": 128}


def _board(device: torch.device) -> dict[str, float | None]:
    """The SM clock (MHz), board power (W) and temperature (C) NVML reports now; None where
    it cannot be read (a CPU, a driver without the query)."""
    if device.type != "cuda":
        return {"sm_clock_mhz": None, "power_w": None, "temperature_c": None}
    index = device.index or 0

    def read(query: Callable[[int], float], scale: float = 1.0) -> float | None:
        try:
            return float(query(index)) * scale
        except Exception:  # pynvml missing or the query unsupported on this driver
            return None

    return {"sm_clock_mhz": sm_clock_mhz(index), "power_w": read(torch.cuda.power_draw, 1e-3),
            "temperature_c": read(torch.cuda.temperature)}


def _batch_seconds(work: Callable[[], object], calls: int, device: torch.device) -> tuple[float, dict[str, Any]]:
    """``calls`` calls of ``work`` queued together: their device time (CUDA events; the host
    clock on a CPU) and the board's readings taken while they run."""
    if device.type == "cuda":
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(calls):
            work()
        end.record()
        board = _board(device)
        end.synchronize()
        return begin.elapsed_time(end) / 1e3, board
    start = time.perf_counter()
    for _ in range(calls):
        work()
    return time.perf_counter() - start, _board(device)


def hold(work: Callable[[], object], calls: int, seconds: float, warmup_s: float, device: torch.device,
         work_per_call: float, unit: str) -> dict[str, Any]:
    """Run ``work`` in batches of ``calls`` for ``warmup_s`` then ``seconds``: every batch's
    rate (``work_per_call`` per call, in ``unit`` per second) and readings, and the medians of
    the first second against the last half."""
    start = time.perf_counter()
    while time.perf_counter() - start < warmup_s:
        _batch_seconds(work, calls, device)
    synchronize(device)
    samples: list[dict[str, Any]] = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        elapsed, board = _batch_seconds(work, calls, device)
        samples.append({"at_s": time.perf_counter() - start, "seconds_per_call": elapsed / calls,
                        "rate": work_per_call * calls / elapsed, **board})
    first = [s for s in samples if s["at_s"] <= 1.0] or samples[:1]
    last = [s for s in samples if s["at_s"] >= seconds / 2] or samples[-1:]
    return {"unit": unit, "seconds": seconds, "warmup_s": warmup_s, "calls_per_batch": calls,
            "first_second": _medians(first), "last_half": _medians(last), "samples": samples}


def _medians(part: list[dict[str, Any]]) -> dict[str, float | None]:
    keys = ("seconds_per_call", "rate", "sm_clock_mhz", "power_w", "temperature_c")
    out: dict[str, float | None] = {}
    for key in keys:
        values = [s[key] for s in part if s.get(key) is not None]
        out[key] = statistics.median(values) if values else None
    return out


def gemm_bf16(device: torch.device, n: int) -> tuple[Callable[[], object], float]:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    return (lambda: torch.mm(a, b)), 2.0 * n**3


def gemm_fp8(device: torch.device, n: int) -> tuple[Callable[[], object], float]:
    """Per-tensor scaled e4m3 operands, the second one column-major (what the FP8 GEMM takes)."""
    a = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device=device).to(torch.float8_e4m3fn).t()
    scale = torch.tensor(1.0, device=device)
    return (lambda: torch._scaled_mm(a, b, scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16)), 2.0 * n**3


def fp8_refusal(device: torch.device) -> str | None:
    """Why this GPU cannot run the FP8 GEMM, or None (a CPU runs it: the dry run's path)."""
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        return f"compute capability {torch.cuda.get_device_capability(device)} has no FP8 tensor cores (8.9+)"
    return None


def training_step(device: torch.device, tiny: bool) -> tuple[Callable[[], object], float]:
    """nnperf's measured step of the module docstring's model; the work unit is a token."""
    overrides = TINY_MODEL if tiny else STEP_MODEL
    seq = 32 if tiny else 4096
    _, build = resolve(ModelRequest("llama-7b", batch=1, seq_len=seq, overrides=overrides))
    options = TraceOptions(dtype="bf16" if device.type == "cuda" else None, optimizer_impl="fused"
                           if device.type == "cuda" else "foreach")
    real = build_step(build, options, device)
    return real.run, float(seq)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (the measurement) or cpu (a dry run, tiny sizes)")
    parser.add_argument("--out", type=Path, required=True, help="the JSON file to write (rewritten after each row)")
    parser.add_argument("--seconds", type=float, default=None, help="how long each load is held (default: 8 s on "
                        "a GPU, 0.2 on a CPU)")
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    gpu = device.type == "cuda"
    seconds = args.seconds if args.seconds is not None else (8.0 if gpu else 0.2)
    warmup = 1.0 if gpu else 0.05
    n = 8192 if gpu else 64
    doc: dict[str, Any] = {"schema": SCHEMA, "device": str(device), "environment": environment(device),
                           "idle": _board(device), "rows": [], "complete": False}

    def save() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(args.out) as tmp:
            tmp.write_text(json.dumps(doc, indent=1) + "\n")

    save()
    begin = time.perf_counter()
    loads: list[tuple[str, Callable[[], tuple[Callable[[], object], float]], int, str, str | None]] = [
        ("gemm-bf16", lambda: gemm_bf16(device, n), 8, "FLOP", None),
        ("gemm-fp8", lambda: gemm_fp8(device, n), 8, "FLOP", fp8_refusal(device)),
        ("step-bf16", lambda: training_step(device, not gpu), 1, "tokens", None),
    ]
    for name, make, calls, unit, refusal in loads:
        if refusal:
            doc["rows"].append({"load": name, "skipped": refusal})
        else:
            work, per_call = make()
            doc["rows"].append({"load": name, "n": n if unit == "FLOP" else None,
                                **hold(work, calls, seconds, warmup, device, per_call, unit)})
            del work
            if gpu:
                torch.cuda.empty_cache()
        save()
        print(f"sustained_clock: {name} done at {time.perf_counter() - begin:.1f} s", flush=True)
    doc["complete"] = True
    doc["seconds"] = time.perf_counter() - begin
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
