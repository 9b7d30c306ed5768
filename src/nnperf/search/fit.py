"""The largest batch that fits on a GPU, for a configuration and its memory what-ifs.

A trace of a large model costs seconds, so the search spends as few as it can and lets
allocator replays (milliseconds) do the rest (``search.fit_replay``):

1. trace batch 1 (reported as "at batch 1"; if it does not fit, nothing does);
2. guess the answer from that one trace (activations scaled by the batch, model states
   not) and trace the guess;
3. interpolate the allocator requests between two traced batches of the same step and
   replay them: bisection to a boundary, then every batch above it up to a bound that is
   monotone (peaks are not monotone in the batch: a larger batch can fragment the cache
   less), which gives the largest batch that fits;
4. trace that batch and the next one: the answer stands only when the traces agree with
   the replays (it fits, the next one does not). When they do not, the traces become the
   new interpolation points; when a step changes with the batch so that no two traces
   interpolate, or too often, the secant/bisection search over traces finds the boundary.

Every answer is a verified trace, never an extrapolation: typically 3 or 4 traces (batch
1, the guess, the answer, the batch after it). ``FitResult.exhaustive`` says whether every
batch above the answer was ruled out too (the replays' budget suffices except for huge
batches of small models), or only the next one, as a search over traces does.

"Fits" means the predicted device total (allocator segments + CUDA context + cuDNN
workspace estimate) is at most the GPU's memory; see ``passes.memory.model``.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any

from nnperf import progress
from nnperf.hardware import GPU
from nnperf.loading import resolve
from nnperf.passes.memory import MemoryReport, predict_memory
from nnperf.passes.memory.capacity import capacity as usable_capacity
from nnperf.passes.memory.device import context_bytes
from nnperf.passes.memory.model import allocation_program, convolution_operand_bytes
from nnperf.passes.memory.report import category_label
from nnperf.request import ModelRequest
from nnperf.search.fit_batch import MAX_BATCH, FitResult, Measure, Probe, Sample, largest_batch
from nnperf.search.fit_parallel import prepare, run_searches, search_workers
from nnperf.search.fit_replay import Footprint
from nnperf.search.memory_variants import MemoryOptions, trace_memory
from nnperf.trace.blocks import repeated_blocks
from nnperf.trace.events import Trace
from nnperf.units import binary

__all__ = ["MAX_BATCH", "FitResult", "Probe", "Sample", "fit", "largest_batch", "not_fitting_message",
           "sample_of", "trace_measure", "what_ifs"]


def what_ifs(options: MemoryOptions, gpu: GPU | None, blocks: bool) -> list[tuple[str, MemoryOptions]]:
    """The configuration as given plus the memory levers that apply to it: first those that
    keep the user's optimizer (mixed precision, checkpointing, both), then SGD, which changes
    the training itself, alone and with the others. The order is the order of advice: the
    first what-if that fits is the one suggested (``not_fitting_message``)."""
    out = [("as given", options)]
    kept: dict[str, Any] = {}  # the levers that keep the optimizer
    step = options.trace
    if step.amp is None and step.dtype is None:
        amp = "bf16" if gpu is None or "bf16" in gpu.supported_dtypes() else "fp16"
        out.append((f"mixed precision (--amp {amp})", options.with_(amp=amp)))
        kept["amp"] = amp
    if step.train and blocks and not options.checkpoint:
        out.append(("activation checkpointing per block", options.with_(checkpoint=True)))
        kept["checkpoint"] = True
    if len(kept) == 2:
        out.append((f"mixed precision and checkpointing, {_optimizer(step)} kept", options.with_(**kept)))
    if step.train and step.optimizer not in ("sgd", "none"):
        out.append(("--optimizer sgd (no state)", options.with_(optimizer="sgd")))
        if kept:
            out.append(("all of the above", options.with_(**kept, optimizer="sgd")))
    return out


def _optimizer(step: Any) -> str:
    return f"{step.optimizer} ({step.optimizer_impl})" if step.optimizer != "none" else "no optimizer"


def trace_measure(
    request: ModelRequest,
    options: MemoryOptions,
    *,
    architecture: str | None = None,
    context_mib: float | None = None,
) -> Measure:
    """Trace ``request`` at a batch under ``options`` and predict its memory: the report and
    the footprint interpolation needs."""


    def measure(batch: int) -> Sample:
        name, trace, _ = trace_memory(replace(request, batch=batch), options)
        return sample_of(batch, name, trace, architecture=architecture, context_mib=context_mib)

    return measure


def sample_of(batch: int, name: str, trace: Trace, *, architecture: str | None = None,
              context_mib: float | None = None, max_points: int = 0) -> Sample:
    """A traced batch as the search needs it: its memory report (with up to ``max_points``
    timeline points) and the footprint interpolation needs."""
    program = allocation_program(trace, None, architecture)
    report = predict_memory(trace, model=name, architecture=architecture,
                            context_mib=context_mib, max_points=max_points, program=program)
    return Sample(report, Footprint.of(batch, program, convolution_operand_bytes(trace),
                                       context_bytes(architecture, context_mib)))


def fit(
    request: ModelRequest,
    gpu: GPU,
    options: MemoryOptions,
    *,
    include_what_ifs: bool = True,
    context_mib: float | None = None,
    max_batch: int = MAX_BATCH,
    workers: int | None = None,
) -> list[FitResult]:
    """Largest batch on ``gpu`` for ``options`` and (optionally) each what-if; the search sets
    the request's batch (any batch it carries is ignored).

    The searches are independent, so they run in ``workers`` processes (None: one per CPU
    core, see ``search_workers``); each result is what a search in this process gives.
    """
    # a fork server, if the searches need one, starts while the what-ifs are worked out
    prepare(workers if workers is not None else search_workers(options, 1 + include_what_ifs))
    capacity = usable_capacity(gpu)  # the rule every command prints (passes/memory/capacity)
    jobs = [("as given", options)]
    if include_what_ifs:
        jobs = what_ifs(options, gpu, options.trace.train and _has_blocks(request))

    if workers is None:
        workers = search_workers(options, len(jobs))
    search = functools.partial(_search, request, gpu, capacity, context_mib, max_batch)
    return run_searches(search, jobs, workers)


def _search(request: ModelRequest, gpu: GPU, capacity: int, context_mib: float | None,
            max_batch: int, label: str, opts: MemoryOptions) -> FitResult:
    """One search of ``fit``: a module-level function so that it pickles to a worker."""
    traced = trace_measure(request, opts, architecture=gpu.architecture, context_mib=context_mib)

    def measure(batch: int) -> Sample:
        progress.note(f"{label}: tracing batch {batch:,}")
        return traced(batch)

    return largest_batch(measure, capacity, label=label, options=opts, max_batch=max_batch)


def _has_blocks(request: ModelRequest) -> bool:
    """Whether the model has repeated blocks to checkpoint (built at batch 1 on fakes)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    _, build = resolve(replace(request, batch=1))
    with FakeTensorMode(allow_non_fake_inputs=True):
        return bool(repeated_blocks(build().model))


def summarize(report: MemoryReport, top: int = 4) -> str:
    """'parameters 25 GiB, gradients 25 GiB, ...' for the largest terms at the peak."""
    terms = sorted(((v, k) for k, v in report.breakdown.items() if v > 0), reverse=True)[:top]
    parts = [f"{category_label(k)} {binary(v)}" for v, k in terms]
    return ", ".join(parts)


def not_fitting_message(model: str, results: list[FitResult], gpu: GPU) -> str:
    """What the smallest configuration needs, what the GPU has, and what would fit instead."""
    base = results[0]
    rep = base.at_one
    what = base.options.describe()
    msg = (
        f"{model} ({what}) needs {binary(rep.device_total or 0)} at batch 1 "
        f"({summarize(rep)}); the {gpu.name} has {binary(usable_capacity(gpu))} usable"
    )
    fitting = [r for r in results[1:] if r.largest]
    if fitting:  # in the what-ifs' order: the user's optimizer kept where that fits
        first, most = fitting[0], max(fitting, key=lambda r: r.largest or 0)
        msg += f"; try {first.label}, which fits batch {first.largest}"
        if (most.largest or 0) > (first.largest or 0):
            msg += f" ({most.label} fits batch {most.largest})"
    elif len(results) == 1:
        msg += "; the what-ifs (mixed precision, checkpointing, SGD) were not searched"
    else:
        msg += (
            "; none of the what-ifs (mixed precision, activation checkpointing, SGD) fit either: "
            "use a GPU with more memory, shard the model across GPUs (FSDP/ZeRO, tensor "
            "parallel), or offload optimizer state to the host"
        )
    return msg
