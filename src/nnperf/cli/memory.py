"""``nnperf memory MODEL``: peak device memory of a step, its breakdown and its timeline."""

from __future__ import annotations

import json
from typing import Any

import click

from nnperf.cli.app import cli
from nnperf.cli.gpu_options import gpu_options
from nnperf.cli.limits import CONTEXT_MIB, LimitedFloat, LimitedInt
from nnperf.cli.workload_options import pop_workload, workload_options
from nnperf.errors import ResourceError
from nnperf.hardware import GPU
from nnperf.passes.memory.capacity import MemoryFit
from nnperf.request import model_label
from nnperf.search.memory_variants import MemoryOptions
from nnperf.trace.options import TraceOptions


def memory_options_from(trace: TraceOptions, kwargs: dict[str, Any]) -> MemoryOptions:
    """``trace`` with the training-loop settings of --grad-accum, --set-to-none, --checkpoint."""
    return MemoryOptions(trace, grad_accum=kwargs["grad_accum"], set_to_none=kwargs["set_to_none"],
                         checkpoint=kwargs["checkpoint"])


def memory_step_options(fn):
    """--grad-accum, --set-to-none/--no-set-to-none, --checkpoint (shared with ``fit``)."""
    for option in reversed([
        click.option("--grad-accum", type=LimitedInt("grad_accum"), default=1, show_default=True,
                     help="Micro-batches per optimizer step (--batch is the micro-batch)."),
        click.option("--set-to-none/--no-set-to-none", default=True, show_default=True,
                     help="zero_grad(set_to_none=...): with --no-set-to-none gradients stay "
                          "allocated through forward."),
        click.option("--checkpoint", is_flag=True,
                     help="Activation checkpointing of every repeated block (layers, residual blocks)."),
        click.option("--context-mib", type=LimitedFloat(CONTEXT_MIB),
                     help="Measured CUDA context size (MiB) instead of the per-architecture estimate."),
        click.option("--cuda-version", metavar="MAJOR.MINOR",
                     help="CUDA of the target stack: before 11.7 there is no lazy module loading "
                          "and the context holds every kernel (>1 GiB); default: a current stack."),
    ]):
        fn = option(fn)
    return fn


def context_mib_of(gpu: GPU, kwargs: dict[str, Any]) -> float | None:
    """``--context-mib`` if given, else the architecture's context under ``--cuda-version``
    (None: the memory model's own per-architecture estimate)."""
    cuda = kwargs.pop("cuda_version", None)
    if kwargs["context_mib"] is not None or cuda is None:
        return kwargs["context_mib"]
    return gpu.arch.context_mib_at(cuda)


@cli.command()
@workload_options
@memory_step_options
@gpu_options(profile=False)
@click.option("--json", "as_json", is_flag=True,
              help="Print the analysis JSON with a 'memory' section instead of tables.")
@click.option("--timeline-points", type=LimitedInt("timeline_points"), default=2000, show_default=True,
              help="Down-sample the JSON timeline to at most this many points (0: every event).")
@click.option("--rows", type=LimitedInt("rows"), default=24, show_default=True,
              help="Rows of the printed timeline.")
@click.option("--validate", "validate_file", type=click.Path(exists=True, dir_okay=False),
              help="JSON of measured peaks (fields: model, config.batch, peak_allocated, peak_reserved, device_total in bytes) to print next to the prediction.")
def memory(gpu: GPU, **kwargs: Any) -> None:
    """Peak device memory of one step of MODEL: parameters, gradients, optimizer state,
    activations kept for backward (per module), temporaries and workspaces, and the
    timeline of allocated memory over the step.
    """
    from nnperf.passes.memory import predict_memory
    from nnperf.search.memory_variants import trace_memory

    request, trace_options = pop_workload(kwargs)
    options = memory_options_from(trace_options, kwargs)
    name, trace, workload = trace_memory(request, options)
    report = predict_memory(trace, model=name, architecture=gpu.architecture,
                            context_mib=context_mib_of(gpu, kwargs),
                            max_points=kwargs["timeline_points"] or len(trace.events) + 1)
    report.config = {"batch": workload.samples, "gpu": gpu.id, "options": options.describe(),
                     "micro_batches": options.grad_accum}
    # one rule for the printed verdict and the exit code: the one ``fit`` searches with
    fit = MemoryFit.on(report.device_total or 0, gpu)
    if kwargs["as_json"]:
        from nnperf.analysis import Analysis

        analysis = Analysis.from_trace(name, options.trace_options(), trace, workload)
        analysis.extra["memory"] = {**report.to_json(), "gpu": gpu.id,
                                    "gpu_memory": fit.capacity}
        click.echo(json.dumps(analysis.to_json(), indent=2, default=str))
    else:
        from nnperf.report.memory_tables import print_memory

        label = model_label(name, request.overrides)
        click.echo(f"{label}: {options.describe()}, batch {workload.samples}"
                   + (f" per micro-batch x{options.grad_accum}" if options.grad_accum > 1 else ""))
        print_memory(report, capacity=fit.capacity, gpu_name=gpu.label,
                     timeline_rows=kwargs["rows"], model=label)
        if kwargs["validate_file"]:
            _print_validation(report, kwargs["validate_file"])
    # Like ``fit``: the answer is printed in full, and the exit code says it does not fit (5).
    if not fit.fits:
        raise ResourceError(_not_fitting(name, options, workload.samples, fit, gpu))


def _not_fitting(name: str, options: MemoryOptions, batch: int, fit: MemoryFit, gpu: GPU) -> str:
    """What the step needs, what the GPU has, and where to look for a batch that fits."""
    from nnperf.units import binary

    return (
        f"{name} ({options.describe()}) DOES NOT FIT at batch {batch}: it needs "
        f"{binary(fit.device_total)} (device total estimate), the {gpu.name} has "
        f"{binary(fit.capacity)}; try a smaller --batch, or 'nnperf fit {name} --gpu "
        f"{gpu.id}' for the largest batch that fits"
    )


def _print_validation(report: Any, path: str) -> None:
    """Predicted vs measured for the entries of ``path`` that match this model and batch."""
    from nnperf.passes.memory import compare, load_measurements
    from nnperf.report.console import make_console
    from nnperf.report.memory_tables import comparison_table

    matches = [m for m in load_measurements(path)
               if m.model == report.model and m.config.get("batch") == report.config.get("batch")]
    if not matches:
        click.echo(f"no measurement in {path} for {report.model} at batch "
                   f"{report.config.get('batch')}")
        return
    for m in matches:
        title = f"Predicted vs measured ({m.config.get('device', m.config.get('gpu', '?'))})"
        make_console().print(comparison_table(compare(report, m), title))
