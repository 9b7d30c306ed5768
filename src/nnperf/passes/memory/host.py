"""Peak tensor memory of a step run on the CPU: the trace's lifetimes without a GPU allocator.

PyTorch's CPU allocator has no cache, no 512-byte blocks and no segments: a tensor's storage
is allocated when an op creates it and returned when its last reference dies. So the peak of
the bytes the trace says are alive is what the CPU allocator reports, byte for byte, and a
measurement on the CPU (``nnperf measure --device cpu``) checks the lifetime replay that the
GPU prediction stands on, independently of the caching-allocator simulation layered on it.

Everything is resident in the one memory: host scalars (optimizer ``step`` counters,
constants lifted from Python numbers) count like any other tensor, and there are no cuBLAS
workspaces.
"""

from __future__ import annotations

from collections import defaultdict

from nnperf.passes.memory.model import classify, model_states, saved_activations_by_module
from nnperf.passes.memory.report import CATEGORIES, MemoryReport
from nnperf.trace.events import Trace


def predict_host_memory(trace: Trace, *, model: str = "model") -> MemoryReport:
    """Peak bytes of live tensors in the traced steady-state step, for a CPU run.

    Tensors that exist before the step (parameters, buffers, the batch, optimizer state, and
    gradients when they persist across steps) are alive from the start; the rest follow the
    trace's allocate/release events.
    """
    roles = classify(trace)
    storages = trace.storages
    live: dict[str, int] = defaultdict(int)
    for sid, info in storages.items():
        if info.created_by is None:
            live[roles[sid].category] += info.nbytes
    peak = sum(live.values())
    at_peak: dict[str, int] = dict(live)
    peak_event = peak_phase = peak_module = None
    for e in trace.events:
        for sid in e.allocates:
            live[roles[sid].category] += storages[sid].nbytes
        total = sum(live.values())
        if total > peak:
            peak, at_peak = total, dict(live)
            peak_event, peak_phase, peak_module = e.index, e.phase, e.module
        for sid in e.releases:
            live[roles[sid].category] -= storages[sid].nbytes

    report = MemoryReport(source="predicted", model=model)
    report.config = {"device": "cpu"}
    report.peak_allocated = peak
    report.peak_requested = peak
    report.peak_event, report.peak_phase, report.peak_module = peak_event, peak_phase, peak_module
    report.breakdown = {c: int(at_peak.get(c, 0)) for c in CATEGORIES}
    report.saved_activations = saved_activations_by_module(trace, roles)
    report.model_states = model_states(trace, roles)
    report.notes = [
        "CPU: tensor bytes alive at the peak, as the CPU allocator reports them (no caching, "
        "no rounding, no workspaces); host scalars included"
    ]
    return report

