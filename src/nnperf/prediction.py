"""``nnperf.predict``: an Analysis plus predicted time on one GPU, per op, module and step."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from nnperf.analysis import Analysis, analyze
from nnperf.errors import UsageError
from nnperf.hardware import GPU, DeviceProfile, default_profile, load_gpu
from nnperf.passes.costs import registry as cat
from nnperf.passes.memory import MemoryReport, predict_memory
from nnperf.passes.memory.capacity import MemoryFit
from nnperf.passes.rollup import ancestors, depth_of
from nnperf.passes.timing import OpTime, StepTime, TimingOptions, simulate_step

SCHEMA_VERSION = "nnperf.prediction/1"


@dataclass
class TimeTally:
    """Predicted time of a group of ops; FLOPs and bytes for rates and required bandwidth."""

    time_s: float = 0.0  # share of the step: kernels plus device idle waiting on the host
    kernel_s: float = 0.0
    idle_s: float = 0.0
    compute_s: float = 0.0
    memory_s: float = 0.0
    # The kernel model's terms (with the profile's efficiencies), summed over the group's
    # ops: with the launch overhead and the device's wait on the host they decide ``bound``.
    model_compute_s: float = 0.0
    model_memory_s: float = 0.0
    overhead_s: float = 0.0
    flops: float = 0.0
    bytes_in: float = 0.0
    bytes_out: float = 0.0
    bytes_weights: float = 0.0
    peak_flops: float = 0.0  # of the unit doing most of the FLOPs
    # The whole step's bound (set on the root row): decided by the timeline (host issue time
    # against device busy time), as the summary prints it, not by the largest share.
    step_bound: str | None = None

    def add(self, t: OpTime, flops: float, b_in: float, b_out: float, b_w: float) -> None:
        self.time_s += t.wall_s
        self.kernel_s += t.kernel_s
        self.idle_s += t.idle_before_s
        self.compute_s += t.compute_s
        self.memory_s += t.memory_s
        self.model_compute_s += t.model_compute_s
        self.model_memory_s += t.model_memory_s
        self.overhead_s += t.overhead_s
        self.flops += flops
        self.bytes_in += b_in
        self.bytes_out += b_out
        self.bytes_weights += b_w
        if flops and t.peak_flops and (self.peak_flops == 0 or t.category in (cat.GEMM, cat.CONV, cat.ATTENTION)):
            self.peak_flops = max(self.peak_flops, t.peak_flops) if self.peak_flops else t.peak_flops

    @property
    def demands(self) -> dict[str, float]:
        """Seconds the group would take if only one limit existed: its modeled compute, its
        modeled memory traffic, its kernels' launch overhead, the device's wait on the host."""
        return {
            "launch": self.overhead_s,
            "compute": self.model_compute_s,
            "memory": self.model_memory_s,
            "host": self.idle_s,
        }

    @property
    def bound(self) -> str:
        """The largest of ``demands``: for one op the kernel model's own verdict (launch when
        the overhead is at least both terms, else the larger term) unless it waited longer on
        the host; for a group, the limit whose removal would save the most, which is what the
        Compute and Memory columns show, so the label never contradicts them. The root row
        carries the step's bound instead (``step_bound``)."""
        if self.step_bound is not None:
            return self.step_bound
        items = {k: v for k, v in self.demands.items() if v > 0}
        return max(items, key=items.get) if items else "none"

    @property
    def achieved_flops(self) -> float:
        return self.flops / self.kernel_s if self.kernel_s else 0.0

    @property
    def fraction_of_peak(self) -> float:
        return self.achieved_flops / self.peak_flops if self.peak_flops else 0.0

    def required_bw(self) -> dict[str, float] | None:
        """Bytes/s each stream needs to keep the math units busy (None: no arithmetic)."""
        if not self.compute_s:
            return None
        return {
            "in": self.bytes_in / self.compute_s,
            "out": self.bytes_out / self.compute_s,
            "weights": self.bytes_weights / self.compute_s,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "time_s": self.time_s,
            "kernel_s": self.kernel_s,
            "idle_s": self.idle_s,
            "compute_s": self.compute_s,
            "memory_s": self.memory_s,
            "compute_model_s": self.model_compute_s,
            "memory_model_s": self.model_memory_s,
            "bound": self.bound,
            "achieved_flops": self.achieved_flops,
            "fraction_of_peak": self.fraction_of_peak,
            "required_bw": self.required_bw(),
        }


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
            self.memory_report = predict_memory(
                self.analysis.trace, model=self.analysis.model, architecture=self.gpu.architecture
            )
        return self.memory_report

    @property
    def memory_fit(self) -> MemoryFit:
        """The predicted device total against the GPU's memory: a time for a step that does
        not fit is a time nobody can run, so every output says which it is."""
        return MemoryFit.on(self.memory.device_total or 0, self.gpu)

    def _counts(self):
        return {c.index: c for c in self.analysis.ops}

    def by_module(self, depth: int | None = None) -> dict[str, TimeTally]:
        counts = self._counts()
        out: dict[str, TimeTally] = defaultdict(TimeTally)
        for t in self.step.ops:
            c = counts[t.index]
            for a in ancestors(t.module):
                if depth is None or depth_of(a) <= depth:
                    out[a].add(t, c.flops, c.bytes_in, c.bytes_out, c.bytes_weights)
        if "" in out:
            out[""].step_bound = self.step.bound
        return dict(out)

    def by_op(self) -> dict[str, TimeTally]:
        counts = self._counts()
        out: dict[str, TimeTally] = defaultdict(TimeTally)
        for t in self.step.ops:
            c = counts[t.index]
            out[t.op].add(t, c.flops, c.bytes_in, c.bytes_out, c.bytes_weights)
        return dict(sorted(out.items(), key=lambda kv: -kv[1].time_s))

    @property
    def matmul_dtype(self) -> str:
        """The dtype carrying most GEMM FLOPs: the peak MFU is measured against."""
        flops: dict[str, float] = defaultdict(float)
        for g in self.analysis.gemms:
            flops[g.dtype] += g.flops
        return max(flops, key=flops.get) if flops else "fp32"

    @property
    def totals(self) -> dict[str, Any]:
        wl = self.analysis.workload
        step = self.step.step_s
        dtype = self.matmul_dtype
        peak = self.gpu.matmul_peak(dtype, tf32=self.timing.tf32_matmul, fallback=True).flops
        model_flops = self.model_flops
        per_s = (wl.tokens or wl.samples) / step if step else 0.0
        return {
            "step_time_s": step,
            "throughput": per_s,
            "throughput_unit": "tokens/s" if wl.tokens else "samples/s",
            "samples_per_s": wl.samples / step if step else 0.0,
            "mfu": model_flops / step / peak if step and peak else 0.0,
            "mfu_flops": model_flops,
            "mfu_peak_flops": peak,
            "mfu_dtype": dtype,
            "bound": self.step.bound,
            "host_s": self.step.host_s,
            "device_busy_s": self.step.device_busy_s,
            "device_idle_s": self.step.device_idle_s,
            "kernels": sum(t.kernels for t in self.step.ops),
            **self.memory_fit.to_json(),
        }

    @property
    def model_flops(self) -> float:
        """The FLOPs MFU counts: forward and backward (the loss included), not the optimizer's
        elementwise update, which is not the model's arithmetic."""
        t = self.analysis.totals
        return t["flops_forward"] + t["flops_backward"]

    def to_json(self, depth: int | None = None) -> dict[str, Any]:
        doc = self.analysis.to_json(depth=depth)
        doc["schema"] = SCHEMA_VERSION
        doc["gpu"] = self.gpu.to_dict()
        doc["timing_options"] = {"tf32_matmul": self.timing.tf32_matmul, "tf32_conv": self.timing.tf32_conv}
        mods = self.by_module(depth)
        for row in doc["modules"]:
            row.update(mods.get(row["name"], TimeTally()).to_json())
        ops = self.by_op()
        for row in doc["ops"]:
            row.update(ops.get(row["op"], TimeTally()).to_json())
        doc["totals"].update(self.totals)
        return doc

    def _repr_html_(self) -> str:
        """Notebook display: summary, roofline chart and per-layer table (no script needed)."""
        from nnperf.report.html import prediction_html

        return prediction_html(self)

    def __repr__(self) -> str:
        from nnperf.report.units import rate

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
    gpu_overrides: dict[str, str] | None = None,
    **analyze_kwargs: Any,
) -> Prediction:
    """Predict one step of ``model`` on ``gpu`` (a catalog name or a GPU object).

    ``analyze_kwargs`` are those of ``nnperf.analyze`` (inputs, train, dtype, amp, batch, ...).
    """
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
    return predict_analysis(analysis, gpu, profile, TimingOptions(tf32_matmul=tf32))
