"""``nnperf.predict``: an Analysis plus predicted time on one GPU, per op, module and step."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from torch import nn

from nnperf.accuracy import TrackRecord, prediction_traits, track_record
from nnperf.analysis import Analysis, analyze
from nnperf.errors import UsageError
from nnperf.hardware import GPU, DeviceProfile, default_profile, load_gpu
from nnperf.passes.costs import registry as cat
from nnperf.passes.estimates import Estimates
from nnperf.passes.memory import MemoryReport, predict_memory
from nnperf.passes.memory.capacity import MemoryFit
from nnperf.passes.memory.fused import fused_releases
from nnperf.passes.rollup import group_by_module, group_by_op
from nnperf.passes.timing import StepTime, TimingOptions, simulate_step

SCHEMA_VERSION = "nnperf.prediction/1"


@dataclass(frozen=True)
class MfuPeak:
    """The peak MFU divides by: that of the math the step's matrix kernels actually ran.

    Each GEMM and convolution is timed on one unit at one rate (fp32 on CUDA cores, TF32 or
    bf16 on tensor cores, a GEMV on CUDA cores); attention at its dtype's tensor rate. The
    peak is their FLOP-weighted harmonic mean, sum(FLOPs) / sum(FLOPs / peak of its unit):
    the rate at which the step's matrix FLOPs would all run if every kernel reached the peak
    of the unit it runs on. With one math mode it is that mode's peak; with fp32 GEMMs (CUDA
    cores, TF32 off by default for matmuls) beside TF32 convolutions (on by default in cuDNN)
    it is between the two. Each peak is the datasheet's, at the clock it is quoted at, not the
    lower clock a GPU holds under sustained load (``GPU.sustained_clock_mhz``): MFU as PaLM and
    Megatron-LM report it, so an H100 step's MFU reads as theirs (its most is then 1470/1830 of
    the tensor peak). A step without matrix FLOPs keeps the matrix peak of its main dtype."""

    flops: float  # FLOP/s
    math: str  # the modes, most FLOPs first: "tf32", "bf16", "tf32+fp32"


@dataclass
class Prediction:
    analysis: Analysis
    gpu: GPU
    profile: DeviceProfile
    timing: TimingOptions
    step: StepTime
    memory_report: MemoryReport | None = field(default=None, repr=False)  # computed on first use

    @property
    def memory(self) -> MemoryReport:
        """The memory model's report of this step on this GPU's architecture. Computed once:
        an allocator replay of the trace, a small fraction of the trace's own time (0.3 s
        against 4.9 s for llama-7b)."""
        if self.memory_report is None:
            trace = self.analysis.trace
            self.memory_report = predict_memory(
                trace, model=self.analysis.model, architecture=self.gpu.architecture,
                releases=fused_releases(trace, self.analysis.ops),
            )
        return self.memory_report

    @property
    def memory_fit(self) -> MemoryFit:
        """The predicted device total against the GPU's memory: a time for a step that does
        not fit is a time nobody can run, so every output says which it is."""
        return MemoryFit.on(self.memory.device_total or 0, self.gpu)

    def by_module(self, depth: int | None = None) -> dict[str, Estimates]:
        """Each module group's timed ops summed; the root row carries the step's bound."""
        out = {name: Estimates.from_times(ts) for name, ts in group_by_module(self.step.ops, depth).items()}
        if "" in out:
            out[""] = replace(out[""], step_bound=self.step.bound)
        return out

    def by_op(self) -> dict[str, Estimates]:
        out = {name: Estimates.from_times(ts) for name, ts in group_by_op(self.step.ops).items()}
        return dict(sorted(out.items(), key=lambda kv: -kv[1].time_s))

    @property
    def matmul_dtype(self) -> str:
        """The dtype carrying most GEMM FLOPs (the roofline's roofs are for it)."""
        flops: dict[str, float] = defaultdict(float)
        for g in self.analysis.gemms:
            flops[g.dtype] += g.flops
        return max(flops, key=flops.get) if flops else "fp32"

    @cached_property
    def mfu_peak(self) -> MfuPeak:
        """See ``MfuPeak``: built from the rate each GEMM and attention op was timed at."""
        flops: dict[tuple[str, float], float] = defaultdict(float)  # (mode, peak) -> FLOPs
        for t in self.step.ops:
            for g in t.gemms:
                e = g.estimate
                if g.gemm.flops and e.peak_flops:
                    # a GEMV of a tensor-core dtype runs on CUDA cores: say so beside its peak
                    mode = f"{e.rate_dtype}-cuda-core" if e.math_unit == "cuda" and e.rate_dtype != "fp32" \
                        else e.rate_dtype
                    flops[(mode, self.gpu.quoted_rate(e.peak_flops, e.math_unit, e.rate_dtype))] += g.gemm.flops
            if t.category == cat.ATTENTION and t.count.flops and t.peak_flops:
                flops[(t.math, self.gpu.quoted_rate(t.peak_flops, t.math_unit, t.math))] += t.count.flops
        if not flops:
            rate = self.gpu.matmul_peak(self.matmul_dtype, tf32=self.timing.tf32_matmul, fallback=True)
            return MfuPeak(self.gpu.quoted_rate(rate.flops, rate.unit, rate.dtype), rate.dtype)
        by_mode: dict[str, float] = defaultdict(float)
        for (mode, _), f in flops.items():
            by_mode[mode] += f
        math = "+".join(sorted(by_mode, key=lambda m: -by_mode[m]))
        if len(flops) == 1:
            ((_, peak),) = flops
            return MfuPeak(peak, math)
        at_peak_s = sum(f / peak for (_, peak), f in flops.items())
        return MfuPeak(sum(flops.values()) / at_peak_s, math)

    @cached_property
    def track_record(self) -> TrackRecord:
        """How nnperf did on the measured runs most like this step (``nnperf.accuracy``): what
        a reader needs to know how far to trust ``step.step_s``."""
        return track_record(prediction_traits(self))

    @property
    def totals(self) -> dict[str, Any]:
        wl = self.analysis.workload
        step = self.step.step_s
        dtype = self.matmul_dtype
        mfu = self.mfu_peak
        peak = mfu.flops
        model_flops = self.model_flops
        per_s = (wl.tokens or wl.samples) / step if step else 0.0
        return {
            "step_time_s": step,
            "throughput": per_s,
            "throughput_unit": "tokens/s" if wl.tokens else "samples/s",
            "samples_per_s": wl.samples / step if step else 0.0,
            "mfu": model_flops / step / peak if step and peak else 0.0,
            "mfu_flops": model_flops,
            "mfu_flops_of": "forward" if self.analysis.trace.mode == "inference" else "forward+backward",
            "mfu_peak_flops": peak,
            "mfu_dtype": dtype,
            "mfu_math": mfu.math,
            "bound": self.step.bound,
            "host_s": self.step.host_s,
            "host_busy_s": self.step.host_busy_s,
            "device_busy_s": self.step.device_busy_s,
            "device_idle_s": self.step.device_idle_s,
            "kernels": sum(t.kernels for t in self.step.ops),
            **self.memory_fit.to_json(),
        }

    @property
    def model_flops(self) -> float:
        """The FLOPs MFU counts: forward and backward (the loss included), not the optimizer's
        elementwise update, which is not the model's arithmetic, nor the forward work activation
        checkpointing runs again in backward: MFU counts the model's FLOPs whatever the
        implementation recomputes (Chowdhery et al. 2022, "PaLM", appendix B; with the
        recomputation it would be the hardware FLOPs utilization)."""
        t = self.analysis.totals
        return t["flops_forward"] + t["flops_backward"] - t.get("flops_recomputed", 0.0)

    def to_json(self, depth: int | None = None) -> dict[str, Any]:
        doc = self.analysis.to_json(depth=depth)
        doc["schema"] = SCHEMA_VERSION
        doc["gpu"] = self.gpu.to_dict()
        doc["timing_options"] = {"tf32_matmul": self.timing.tf32_matmul, "tf32_conv": self.timing.tf32_conv,
                                 "cudnn_benchmark": self.timing.cudnn_benchmark, **self.profile.host_json()}
        mods = self.by_module(depth)
        for row in doc["modules"]:
            row.update(mods.get(row["name"], Estimates()).time_json())
        ops = self.by_op()
        for row in doc["ops"]:
            row.update(ops.get(row["op"], Estimates()).time_json())
        doc["totals"].update(self.totals)
        doc["track_record"] = self.track_record.to_json()
        return doc

    def _repr_html_(self) -> str:
        """Notebook display: summary, roofline chart and per-layer table (no script needed)."""
        from nnperf.report.html import prediction_html

        return prediction_html(self)

    def __repr__(self) -> str:
        from nnperf.units import rate

        t = self.totals
        return (
            f"Prediction({self.analysis.model!r} on {self.gpu.name}: step {t['step_time_s'] * 1e3:.3f} ms, "
            f"{rate(t['throughput'], t['throughput_unit'])}, MFU {t['mfu']:.1%}, {t['bound']}-bound, "
            f"memory {self.memory_fit.verdict})"
        )


def predict_analysis(
    analysis: Analysis,
    gpu: GPU,
    profile: DeviceProfile | None = None,
    timing: TimingOptions | None = None,
    memory: MemoryReport | None = None,
) -> Prediction:
    """Time ``analysis`` on ``gpu``. ``memory``: the memory model's report of the same trace
    for this GPU's architecture when the caller has it (``compare`` shares one between GPUs
    of one architecture); otherwise it is computed when first asked for."""
    profile = profile or default_profile(gpu)
    timing = timing or TimingOptions()
    step = simulate_step(analysis.trace, analysis.ops, gpu, profile, timing)
    return Prediction(analysis=analysis, gpu=gpu, profile=profile, timing=timing, step=step,
                      memory_report=memory)


def predict(
    model: str | nn.Module | Analysis,
    gpu: str | GPU = "h100",
    *,
    profile: DeviceProfile | None = None,
    tf32: bool = False,
    cudnn_benchmark: bool = False,
    gpu_overrides: dict[str, str] | None = None,
    **analyze_kwargs: Any,
) -> Prediction:
    """Predict one step of ``model`` on ``gpu`` (a catalog name or a GPU object).

    ``tf32``: fp32 matmuls on TF32 tensor cores (``torch.backends.cuda.matmul.allow_tf32``);
    ``cudnn_benchmark``: the step runs with ``torch.backends.cudnn.benchmark`` on.
    ``analyze_kwargs`` are those of ``nnperf.analyze`` (inputs, train, dtype, amp, batch, ...).
    """
    timing = timing_options(tf32, cudnn_benchmark)
    if isinstance(model, Analysis) and analyze_kwargs:
        # An Analysis is already traced: batch, dtype, ... would silently not apply.
        raise UsageError(
            f"predict() got an Analysis and the analyze keyword(s) "
            f"{', '.join(sorted(analyze_kwargs))}, which only apply when predict traces the "
            "model itself: pass them to nnperf.analyze, or pass the model instead of the Analysis"
        )
    if isinstance(gpu, str):
        gpu = load_gpu(gpu, overrides=gpu_overrides)
    analysis = model if isinstance(model, Analysis) else analyze(model, **analyze_kwargs)
    return predict_analysis(analysis, gpu, profile, timing)


def timing_options(tf32: bool = False, cudnn_benchmark: bool = False) -> TimingOptions:
    """The library settings a step runs with, checked: each one on or off (a string such as
    "false" would otherwise read as on)."""
    for name, value in (("tf32", tf32), ("cudnn_benchmark", cudnn_benchmark)):
        if not isinstance(value, bool):
            raise UsageError(f"{name}={value!r} is not a setting: expected True or False")
    return TimingOptions(tf32_matmul=tf32, cudnn_benchmark=cudnn_benchmark)
