"""``nnperf.measure``: time a real step on a device and put it beside nnperf's prediction.

What is measured, and how:

* step time: ``steps`` steps after ``warmup`` steps, each timed alone (CUDA events after a
  synchronize on GPU, ``perf_counter`` on CPU); the median and spread are reported; with
  ``back_to_back``, ``steps`` more run back to back under the host's clock with one
  synchronize at the end (a loop's throughput: the host runs ahead of the device);
* peak memory: ``torch.cuda.max_memory_allocated`` on GPU (the same quantity nnperf's memory
  model predicts as ``peak_allocated``) and the allocator's reserved peak, both read right
  after the timed steps; on the CPU the peak of tensor memory during one more step, from the
  CPU allocator's own allocation reports (``host_memory``), which the memory model predicts
  exactly as ``passes.memory.host`` (no caching allocator on the CPU);
* time per op and module: one extra step under the PyTorch profiler (after a profiler warm-up
  step), aligned with the trace's ops (see ``align``); the time that could not be attributed
  is reported beside the attributed share;
* the library settings the step ran with: TF32 matmuls and ``torch.backends.cudnn.benchmark``
  (set for the run and restored after it).
"""

from __future__ import annotations

import datetime
import platform
import time
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from nnperf import progress
from nnperf.analysis import Analysis, analyze_request
from nnperf.errors import ResourceError, UsageError
from nnperf.loading import resolve
from nnperf.measure import host_memory
from nnperf.measure.align import Alignment, align, flatten_profile
from nnperf.measure.device import (
    cuda_peaks,
    device_name,
    free_memory,
    is_oom,
    synchronize,
    time_back_to_back,
    time_repeats,
)
from nnperf.measure.kernel_times import KernelTimes, is_cpu
from nnperf.measure.stats import Spread, percentile, relative_error
from nnperf.measure.step import build_step
from nnperf.passes.rollup import ancestors, depth_of
from nnperf.request import ModelRequest
from nnperf.trace.options import TraceOptions

SCHEMA_VERSION = "nnperf.measurement/1"


@dataclass
class Measurement:
    """A measured step: times, peak memory and the per-op attribution."""

    model: str
    device: str
    device_name: str
    mode: str
    batch: int
    step_times_s: list[float]
    peak_memory_bytes: int | None
    memory_method: str
    alignment: Alignment | None = None
    profiled_step_s: float | None = None
    environment: dict[str, Any] = field(default_factory=dict)
    peak_reserved_bytes: int | None = None  # GPU: the caching allocator's reserved peak
    back_to_back_step_s: float | None = None  # host clock over back-to-back steps, one sync
    tf32: bool = False  # torch.backends.cuda.matmul.allow_tf32 during the steps
    cudnn_benchmark: bool = False  # torch.backends.cudnn.benchmark during the steps

    @property
    def step(self) -> Spread:
        return Spread.of(self.step_times_s)

    @property
    def op_times(self) -> dict[int, float]:
        """Trace event index -> measured seconds (profiled step)."""
        return self.alignment.by_event if self.alignment else {}

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_VERSION,
            "model": self.model,
            "device": self.device,
            "device_name": self.device_name,
            "mode": self.mode,
            "batch": self.batch,
            "step_time_s": self.step.to_json(),
            "step_times_s": self.step_times_s,
            "peak_memory_bytes": self.peak_memory_bytes,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "memory_method": self.memory_method,
            "back_to_back_step_s": self.back_to_back_step_s,
            "tf32": self.tf32,
            "cudnn_benchmark": self.cudnn_benchmark,
            "profiled_step_s": self.profiled_step_s,
            "unmatched_s": self.alignment.unmatched_s if self.alignment else None,
            "attribution": self.alignment.to_json() if self.alignment else None,
            "attributed_share_of_step": self.attributed_share_of_step,
            "environment": self.environment,
        }

    @property
    def attributed_share_of_step(self) -> float | None:
        """Matched op time over the profiled step's wall time (on GPU: device time)."""
        if not self.alignment or not self.profiled_step_s:
            return None
        return min(1.0, self.alignment.matched_s / self.profiled_step_s)


def environment(device: torch.device) -> dict[str, Any]:
    """What a measurement must carry to be comparable later: versions, device, date."""
    env: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "host": platform.node(),
        "cpu": device_name(torch.device("cpu")),
        "cpu_threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(
            gpu=torch.cuda.get_device_name(device),
            cuda=torch.version.cuda,
            driver=_driver_version(),
            gpu_memory_bytes=props.total_memory,
            sm_count=props.multi_processor_count,
            cudnn=torch.backends.cudnn.version(),
        )
    return env


def _driver_version() -> str | None:
    """The NVIDIA driver version via NVML when present (torch ships pynvml optional)."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:
        try:
            import subprocess

            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=10, check=False,
            )
            return out.stdout.strip().splitlines()[0] if out.stdout.strip() else None
        except Exception:
            return None


def predicted_peak_memory(analysis: Analysis, device: str = "cuda") -> int:
    """nnperf's predicted peak of what ``measure`` measures on ``device``: allocated bytes
    of the CUDA caching allocator on a GPU, bytes of live tensors on the CPU."""
    from nnperf.passes.memory.host import predict_host_memory
    from nnperf.passes.memory.model import predict_memory

    if device.startswith("cpu"):
        return int(predict_host_memory(analysis.trace, model=analysis.model).peak_allocated)
    return int(predict_memory(analysis.trace, model=analysis.model).peak_allocated)


def measure(
    request: ModelRequest,
    options: TraceOptions | None = None,
    *,
    device: torch.device,
    steps: int = 10,
    warmup: int = 3,
    tf32: bool = False,
    cudnn_benchmark: bool = False,
    profile_ops: bool = True,
    profile_repeats: int = 3,
    back_to_back: bool = False,
    analysis: Analysis | None = None,
    trace_out: str | None = None,
) -> tuple[Measurement, Analysis]:
    """Measure one step of the requested workload on ``device``; returns the measurement and
    its trace (``analysis`` when given, traced with the same request and options).

    ``tf32`` and ``cudnn_benchmark`` set ``torch.backends.cuda.matmul.allow_tf32`` and
    ``torch.backends.cudnn.benchmark`` for the run (restored after it); ``back_to_back`` also
    times ``steps`` steps back to back (``Measurement.back_to_back_step_s``).

    Raises ``ResourceError`` ("does not fit at batch N") on out-of-memory, after freeing what
    the failed run held so the caller can try a smaller batch in the same process.
    """
    options = options or TraceOptions()
    if device.type == "cpu":  # the step runs CPU autocast: the trace beside it follows its lists
        options = replace(options, autocast_device="cpu")
    progress.expect(3 if profile_ops else 2)  # the trace, the timed steps, the profiled step
    if analysis is None:
        progress.note("tracing the step for the prediction")
        analysis = analyze_request(request, options)
    progress.advance()
    name, build = resolve(request)
    previous = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.benchmark)
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = cudnn_benchmark
    step = None
    try:
        if device.type == "cuda":
            free_memory(device)
        step = build_step(build, options, device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        progress.note(f"{warmup} warm-up and {steps} timed steps (a step's progress is not drawn while timed)")
        times = time_repeats(step.run, device, warmup=warmup, repeats=steps)
        synchronize(device)
        settings = (bool(torch.backends.cuda.matmul.allow_tf32), bool(torch.backends.cudnn.benchmark))
        reserved: int | None = None
        progress.advance()
        if device.type == "cuda":
            memory_method = "torch.cuda.max_memory_allocated"
            peaks = cuda_peaks(device)  # before profiling or freeing resets them
            peak: int | None = peaks.allocated_bytes
            reserved = peaks.reserved_bytes
        else:
            memory_method = host_memory.METHOD
            peak = host_memory.peak_tensor_bytes(step.run, step.state_tensors)
        wall = time_back_to_back(step.run, device, steps) if back_to_back else None
        alignment, profiled = (None, None)
        if profile_ops:
            progress.note("profiling a step's ops")
            alignment, profiled = _profile_step(step.run, device, analysis, trace_out, profile_repeats)
            progress.advance()
    except NotImplementedError as err:  # PyTorch has no kernel for this dtype on this device
        step = None
        free_memory(device)
        precision = f"--amp {options.amp}" if options.amp else f"--dtype {options.dtype or 'fp32'}"
        raise UsageError(
            f"{name} cannot run on {device_name(device)} in {precision}: "
            f"{str(err).splitlines()[0].rstrip('.')}. Try another precision or device."
        ) from None
    except Exception as err:
        if not is_oom(err):
            raise
        step = None
        measured_peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
        free_memory(device)
        predicted = predicted_peak_memory(analysis, device.type)
        from nnperf.units import binary

        capacity = (
            torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
        )
        raise ResourceError(
            f"{name} does not fit at batch {analysis.workload.samples} on {device_name(device)}: "
            f"out of memory (measured peak before failing: "
            f"{binary(measured_peak) if measured_peak is not None else 'n/a'}; predicted peak: "
            f"{binary(predicted) if predicted is not None else 'n/a'}; device memory: "
            f"{binary(capacity) if capacity else 'n/a'}). Try a smaller --batch."
        ) from None
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.benchmark = previous
    measurement = Measurement(
        model=name,
        device=str(device),
        device_name=device_name(device),
        mode="train" if options.train else "inference",
        batch=analysis.workload.samples,
        step_times_s=times,
        peak_memory_bytes=peak,
        memory_method=memory_method,
        alignment=alignment,
        profiled_step_s=profiled,
        environment=environment(device),
        peak_reserved_bytes=reserved,
        back_to_back_step_s=wall,
        tf32=settings[0],
        cudnn_benchmark=settings[1],
    )
    del step
    free_memory(device)
    return measurement, analysis


def _profile_step(
    run: Any, device: torch.device, analysis: Analysis, trace_out: str | None, repeats: int = 3
) -> tuple[Alignment, float]:
    """Profile ``repeats`` single steps (each after a profiled warm-up step), align each with
    the trace, and keep the per-op median: one profiled step alone is at the mercy of a
    stall (another process, a page fault) landing inside it."""
    runs = [_profile_once(run, device, analysis, trace_out if i == repeats - 1 else None) for i in range(repeats)]
    merged = Alignment(profiled_ops=runs[-1][0].profiled_ops, trace_ops=runs[-1][0].trace_ops,
                       kernels=runs[-1][0].kernels)
    for index in {i for a, _ in runs for i in a.by_event}:
        merged.by_event[index] = percentile([a.by_event.get(index, 0.0) for a, _ in runs], 50)
    merged.matched_s = sum(merged.by_event.values())
    merged.unmatched_s = percentile([a.unmatched_s for a, _ in runs], 50)
    merged.matched_ops = runs[-1][0].matched_ops
    merged.profiler_only = runs[-1][0].profiler_only
    merged.trace_only = runs[-1][0].trace_only
    return merged, percentile([w for _, w in runs], 50)


def _profile_once(run: Any, device: torch.device, analysis: Analysis, trace_out: str | None) -> tuple[Alignment, float]:
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    wall = 0.0
    with profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=1, repeat=1)) as prof:
        for i in range(2):
            synchronize(device)
            t0 = time.perf_counter()
            run()
            synchronize(device)
            if i == 1:
                wall = time.perf_counter() - t0
            prof.step()
    if trace_out:
        prof.export_chrome_trace(trace_out)
    events = prof.events()
    kernels = KernelTimes.of(events) if device.type == "cuda" else None
    roots = [e for e in events if e.cpu_parent is None and is_cpu(e)]
    trace_ops = [(e.index, e.name) for e in analysis.trace.events if not e.free]
    known = {name for _, name in trace_ops}
    profiled = flatten_profile(roots, known, kernels=kernels)
    result = align(trace_ops, profiled, kernels)
    if kernels is not None:
        # kernels only: compare with the device time of the step, never less than its busy time
        return result, max(wall, kernels.busy_s)
    return result, wall


# ---- measured beside predicted ------------------------------------------------------------
def measured_by_module(m: Measurement, analysis: Analysis, depth: int | None) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    modules = {e.index: e.module for e in analysis.trace.events}
    for index, seconds in m.op_times.items():
        for a in ancestors(modules[index]):
            if depth is None or depth_of(a) <= depth:
                out[a] += seconds
    return dict(out)


def measured_by_op(m: Measurement, analysis: Analysis) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    names = {e.index: e.name for e in analysis.trace.events}
    for index, seconds in m.op_times.items():
        out[names[index]] += seconds
    return dict(out)


def compared_field(device: str) -> str:
    """Which predicted time a measured op/module time is compared with.

    On a GPU the profiler gives each op's kernel (device) time, so it is compared with the
    predicted ``kernel_s``; on the CPU an op's time is its whole cost (dispatch and math run on
    the same thread), compared with the predicted ``time_s``.
    """
    return "kernel_s" if device.startswith("cuda") else "time_s"


def combined_json(m: Measurement, analysis: Analysis, prediction: Any | None, depth: int | None) -> dict[str, Any]:
    """``predict --json``'s document with measured values beside the predicted ones.

    Without a prediction the analysis document carries the measured values alone.
    """
    doc = prediction.to_json(depth=depth) if prediction is not None else analysis.to_json(depth=depth)
    key = compared_field(m.device)
    mods = measured_by_module(m, analysis, depth)
    # A module or op none of whose traced ops was found in the profile is "not matched"
    # (None), never 0: on the CPU, say, dropout runs as bernoulli_ and mul, not native_dropout.
    for row in doc["modules"]:
        row["measured_time_s"] = mods.get(row["name"]) if m.alignment else None
        row["error"] = relative_error(row.get(key), row["measured_time_s"]) if prediction is not None else None
    ops = measured_by_op(m, analysis)
    for row in doc["ops"]:
        row["measured_time_s"] = ops.get(row["op"]) if m.alignment else None
        row["error"] = relative_error(row.get(key), row["measured_time_s"]) if prediction is not None else None
    step = m.step
    totals = doc["totals"]
    totals["measured_step_time_s"] = step.median
    totals["measured_step_time_spread"] = step.to_json()
    totals["measured_peak_memory_bytes"] = m.peak_memory_bytes
    totals["measured_memory_method"] = m.memory_method
    totals["predicted_peak_memory_bytes"] = predicted_peak_memory(analysis, m.device)
    totals["peak_memory_error"] = relative_error(totals["predicted_peak_memory_bytes"], m.peak_memory_bytes)
    totals["step_time_error"] = relative_error(totals.get("step_time_s"), step.median) if prediction else None
    totals["measured_samples_per_s"] = m.batch / step.median if step.median else None
    doc["measurement"] = m.to_json()
    doc["measurement"]["module_time_compared_with"] = key
    doc["prediction_available"] = prediction is not None
    return doc
