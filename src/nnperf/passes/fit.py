"""The largest batch that fits on a GPU, for a configuration and its memory what-ifs.

Peak memory grows almost linearly with the batch (activations scale with it, model states
do not), so the search needs few traces: trace batch 1 and 2, propose the batch where the
line meets the GPU's capacity, trace it, and step with the secant through the bracketing
points until the largest fitting batch and the smallest failing one are adjacent. Every
answer is a verified trace, never an extrapolation.

"Fits" means the predicted device total (allocator segments + CUDA context + cuDNN
workspace estimate) is at most the GPU's memory; see ``passes.memory.model``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from nnperf.hardware import GPU
from nnperf.loading import resolve
from nnperf.passes.memory import CATEGORY_LABELS, MemoryReport, predict_memory
from nnperf.passes.memory.tracing import MemoryOptions, checkpoint_blocks, trace_memory
from nnperf.report.units import binary
from nnperf.request import ModelRequest

#: Never search beyond this batch: a model this small fits "any batch" for practical purposes.
MAX_BATCH = 1 << 20
#: The second batch traced: far enough from 1 that allocator rounding does not hide the slope.
FIRST_STEP = 8
#: After this many probes in a row that move the fitting batch by one, bisect (a step-shaped
#: peak near the boundary stalls the secant, which then moves by one batch per trace).
SECANT_PROBES = 2


@dataclass
class Probe:
    batch: int
    device_total: int
    peak_allocated: int
    fits: bool


@dataclass
class FitResult:
    """The outcome of one search: ``largest`` is None when not even batch 1 fits."""

    label: str
    options: MemoryOptions
    capacity: int
    largest: int | None
    capped: bool  # the search stopped at MAX_BATCH: "at least" this batch
    at_largest: MemoryReport | None
    at_one: MemoryReport
    probes: list[Probe] = field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        rep = self.at_largest
        return {
            "what_if": self.label,
            "options": self.options.describe(),
            "largest_batch": self.largest,
            "capped": self.capped,
            "capacity": self.capacity,
            "device_total_at_largest": rep.device_total if rep else None,
            "peak_allocated_at_largest": rep.peak_allocated if rep else None,
            "device_total_at_batch_1": self.at_one.device_total,
            "traces": len(self.probes),
            "seconds": round(self.seconds, 3),
            "probes": [p.__dict__ for p in self.probes],
        }


def largest_batch(
    measure: Callable[[int], MemoryReport],
    capacity: int,
    *,
    label: str = "as given",
    options: MemoryOptions | None = None,
    max_batch: int = MAX_BATCH,
) -> FitResult:
    """Search the largest batch whose predicted device total is at most ``capacity``."""
    start = time.perf_counter()
    reports: dict[int, MemoryReport] = {}
    probes: list[Probe] = []

    def total(b: int) -> int:
        if b not in reports:
            r = measure(b)
            reports[b] = r
            probes.append(Probe(b, int(r.device_total or 0), int(r.peak_allocated or 0),
                                int(r.device_total or 0) <= capacity))
        return int(reports[b].device_total or 0)

    def done(largest: int | None, capped: bool = False) -> FitResult:
        return FitResult(label, options or MemoryOptions(), capacity, largest, capped,
                         reports.get(largest) if largest else None, reports[1], probes,
                         time.perf_counter() - start)

    if total(1) > capacity:
        return done(None)
    if max_batch <= 1:
        return done(1, capped=True)
    lo, hi = 1, None  # lo fits; hi (when known) does not
    cand = min(FIRST_STEP, max_batch)
    creeping = 0  # consecutive probes that could only move the bound by one batch
    for _ in range(64):
        if total(cand) <= capacity:
            lo = cand
            if lo >= max_batch:
                return done(lo, capped=True)
        else:
            hi = cand
        if hi is not None and hi - lo <= 1:
            break
        if hi is None:  # extrapolate along the chord from batch 1 (the widest, least noisy)
            slope = (total(lo) - total(1)) / (lo - 1)
            # no growth measured yet (allocator rounding hides it): double
            cand = lo * 2 if slope <= 0 else lo + int((capacity - total(lo)) // slope)
            cand = max(lo + 1, min(cand, max_batch))
        else:  # interpolate between the bracketing batches
            slope = (total(hi) - total(lo)) / (hi - lo)
            cand = lo + int((capacity - total(lo)) // slope) if slope > 0 else (lo + hi) // 2
            cand = max(lo + 1, min(cand, hi - 1))
            if cand == lo + 1 and creeping >= SECANT_PROBES:
                cand = (lo + hi) // 2  # peaks move in steps near the boundary: bisect
        creeping = creeping + 1 if cand == lo + 1 else 0
    return done(lo)


def what_ifs(options: MemoryOptions, gpu: GPU | None, blocks: bool) -> list[tuple[str, MemoryOptions]]:
    """The configuration as given plus the memory levers that apply to it."""
    out = [("as given", options)]
    changes: dict[str, Any] = {}
    step = options.trace
    if step.amp is None and step.dtype is None:
        amp = "bf16" if gpu is None or "bf16" in gpu.supported_dtypes() else "fp16"
        out.append((f"mixed precision (--amp {amp})", options.with_(amp=amp)))
        changes["amp"] = amp
    if step.train and blocks and not options.checkpoint:
        out.append(("activation checkpointing per block", options.with_(checkpoint=True)))
        changes["checkpoint"] = True
    if step.train and step.optimizer not in ("sgd", "none"):
        out.append(("--optimizer sgd (no state)", options.with_(optimizer="sgd")))
        changes["optimizer"] = "sgd"
    if len(changes) >= 2:
        out.append(("all of the above", options.with_(**changes)))
    return out


def fit(
    request: ModelRequest,
    gpu: GPU,
    options: MemoryOptions,
    *,
    include_what_ifs: bool = True,
    context_mib: float | None = None,
    max_batch: int = MAX_BATCH,
) -> list[FitResult]:
    """Largest batch on ``gpu`` for ``options`` and (optionally) each what-if; the search sets
    the request's batch (any batch it carries is ignored)."""
    capacity = int(gpu.memory_bytes)

    def measurer(opts: MemoryOptions) -> Callable[[int], MemoryReport]:
        def measure(batch: int) -> MemoryReport:
            name, trace, _ = trace_memory(replace(request, batch=batch), opts)
            return predict_memory(trace, model=name, architecture=gpu.architecture,
                                  context_mib=context_mib, max_points=0)
        return measure

    base = largest_batch(measurer(options), capacity, label="as given", options=options,
                         max_batch=max_batch)
    if not include_what_ifs:
        return [base]
    has_blocks = _has_blocks(request) if options.trace.train else False
    results = [base]
    for label, opts in what_ifs(options, gpu, has_blocks)[1:]:
        results.append(largest_batch(measurer(opts), capacity, label=label, options=opts,
                                     max_batch=max_batch))
    return results


def _has_blocks(request: ModelRequest) -> bool:
    """Whether the model has repeated blocks to checkpoint (built at batch 1 on fakes)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    _, build = resolve(replace(request, batch=1))
    with FakeTensorMode(allow_non_fake_inputs=True):
        return bool(checkpoint_blocks(build().model))


def summarize(report: MemoryReport, top: int = 4) -> str:
    """'parameters 25 GiB, gradients 25 GiB, ...' for the largest terms at the peak."""
    terms = sorted(((v, k) for k, v in report.breakdown.items() if v > 0), reverse=True)[:top]
    parts = [f"{CATEGORY_LABELS.get(k, k.replace('_', ' '))} {binary(v)}" for v, k in terms]
    return ", ".join(parts)


def not_fitting_message(model: str, results: list[FitResult], gpu: GPU) -> str:
    """What the smallest configuration needs, what the GPU has, and what would fit instead."""
    base = results[0]
    rep = base.at_one
    what = base.options.describe()
    msg = (
        f"{model} ({what}) needs {binary(rep.device_total or 0)} at batch 1 "
        f"({summarize(rep)}); the {gpu.name} has {binary(gpu.memory_bytes)}"
    )
    fitting = [r for r in results[1:] if r.largest]
    if fitting:
        best = max(fitting, key=lambda r: r.largest or 0)
        msg += f"; try {best.label}, which fits batch {best.largest}"
    elif len(results) == 1:
        msg += "; the what-ifs (mixed precision, checkpointing, SGD) were not searched"
    else:
        msg += (
            "; none of the what-ifs (mixed precision, activation checkpointing, SGD) fit either: "
            "use a GPU with more memory, shard the model across GPUs (FSDP/ZeRO, tensor "
            "parallel), or offload optimizer state to the host"
        )
    return msg
