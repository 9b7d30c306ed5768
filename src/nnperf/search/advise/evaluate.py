"""Predict one scenario (a ``Change`` of the workload) the way ``nnperf predict`` would.

A change that alters the step is traced again (``search.memory_variants.trace_memory``, as
``fit`` traces its what-ifs); every scenario is then re-written (``rewrite`` and the family
modules), timed by ``passes.timing.simulate_step`` and its memory predicted by
``passes.memory``. Scenarios that need a trace run in worker processes (``jobs``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from nnperf.analysis import Analysis
from nnperf.hardware import GPU, DeviceProfile, default_profile, load_gpu
from nnperf.passes.memory import predict_memory
from nnperf.passes.memory.capacity import capacity
from nnperf.passes.memory.model import MAX_TIMELINE_POINTS
from nnperf.passes.timing import TimingOptions, simulate_step
from nnperf.prediction import Prediction, predict_analysis
from nnperf.request import ModelRequest
from nnperf.search.accumulation import once_span
from nnperf.search.advise import attention, graphs, inductor, padding, precision
from nnperf.search.advise.change import Change, Outcome
from nnperf.search.advise.rewrite import Rewritten
from nnperf.search.fit import Sample, sample_of
from nnperf.search.memory_variants import MemoryOptions, trace_memory


@dataclass(frozen=True)
class Setup:
    """What every scenario shares; it pickles to worker processes (no trace in it)."""

    request: ModelRequest
    options: MemoryOptions
    gpu: GPU
    profile: DeviceProfile
    timing: TimingOptions
    max_batch: int = 1 << 16


@dataclass
class Base:
    """The workload as given: its trace, prediction and outcome, and what the families
    found already done (``checked``: (item name, why it offers nothing))."""

    setup: Setup
    analysis: Analysis
    prediction: Prediction
    outcome: Outcome
    checked: list[tuple[str, str]] = field(default_factory=list)
    #: The memory report and footprint of this trace (``search.fit.sample_of``): the search
    #: for the largest batch as given starts from it instead of tracing the batch again.
    seed: Sample | None = None

    @property
    def gpu(self) -> GPU:
        return self.setup.gpu

    @property
    def profile(self) -> DeviceProfile:
        return self.setup.profile

    @property
    def timing(self) -> TimingOptions:
        return self.setup.timing

    @property
    def options(self) -> MemoryOptions:
        return self.setup.options


def trace_change(setup: Setup, change: Change) -> Analysis:
    """The step re-traced with the change's trace-level settings."""
    options = setup.options.with_(**change.trace_changes())
    if change.recompute is not None:
        options = options.with_(checkpoint="selective" if change.recompute == "selective" else True)
    request = replace(setup.request, batch=change.batch) if change.batch else setup.request
    if change.model:
        request = replace(request, overrides={**request.overrides, **dict(change.model)})
    name, trace, workload = trace_memory(request, options)
    analysis = Analysis.from_trace(name, options.trace, trace, workload)
    analysis.model_options = dict(request.overrides)
    return analysis


def evaluate(setup: Setup, change: Change, analysis: Analysis | None = None,
             memory_cache: dict[str, Any] | None = None) -> Outcome:
    """Predict ``change``: ``analysis`` is the base trace (re-traced when the change needs it)."""
    if analysis is None or change.retraces:
        return price(setup, change, trace_change(setup, change), {})
    return price(setup, change, analysis, memory_cache)


def price(setup: Setup, change: Change, analysis: Analysis,
          memory_cache: dict[str, Any] | None = None) -> Outcome:
    """Predict ``change`` on ``analysis``, the step it runs (already re-traced where the change
    needs it); ``memory_cache``: the memory reports of that trace by architecture."""
    gpu = load_gpu(change.gpu) if change.gpu else setup.gpu
    profile = default_profile(gpu) if change.gpu else setup.profile
    timing = replace(setup.timing, tf32_matmul=True) if change.tf32 else setup.timing
    rw = Rewritten(analysis.trace, list(analysis.ops))
    options = setup.options.with_(**change.trace_changes())
    if change.pad:
        padding.rewrite(analysis, options, rw, dict(change.pad))
    if change.sdpa:
        attention.rewrite(rw)
    if change.fp8:
        precision.rewrite_fp8(rw, gpu, profile)
    if change.fuse:
        inductor.rewrite(rw)
    step = simulate_step(rw.trace, rw.counts, gpu, profile, timing)
    if change.graphs:
        step = graphs.replay(step, profile)
    cache = memory_cache if memory_cache is not None else {}
    report = cache.get(gpu.architecture)
    if report is None:
        report = cache[gpu.architecture] = predict_memory(
            analysis.trace, model=analysis.model, architecture=gpu.architecture, max_points=0)
    peak = (report.device_total or 0) + rw.memory_delta
    optimizer_s = once_span(step)
    return Outcome(
        step_s=step.step_s, host_s=step.host_s, device_busy_s=step.device_busy_s, bound=step.bound,
        samples=analysis.workload.samples, tokens=analysis.workload.tokens, peak_bytes=peak,
        fits=peak <= capacity(gpu), gpu_id=gpu.id, kernels=sum(t.kernels for t in step.ops),
        notes=tuple(rw.notes), optimizer_s=optimizer_s, touched=tuple(sorted(rw.touched)),
    )


def base_of(setup: Setup) -> tuple[Base, dict[str, Any]]:
    """Trace and predict the workload as given (traced like every scenario). Its memory
    report comes with the footprint the largest-batch search interpolates from (``Base.seed``),
    from the one allocator program both need."""
    analysis = trace_change(setup, Change())
    seed = sample_of(analysis.workload.samples, analysis.model, analysis.trace,
                     architecture=setup.gpu.architecture, max_points=MAX_TIMELINE_POINTS)
    prediction = predict_analysis(analysis, setup.gpu, setup.profile, setup.timing, memory=seed.report)
    cache = {setup.gpu.architecture: prediction.memory}
    outcome = evaluate(setup, Change(), analysis, cache)
    return Base(setup, analysis, prediction, outcome, seed=seed), cache
