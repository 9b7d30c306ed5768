"""``nnperf fit MODEL --gpu NAME``: the largest batch that fits, with memory what-ifs."""

from __future__ import annotations

import json
from typing import Any

import click

from nnperf import progress
from nnperf.cli.app import cli
from nnperf.cli.gpu_options import gpu_options
from nnperf.cli.limits import LimitedInt
from nnperf.cli.memory import context_mib_of, memory_options_from, memory_step_options
from nnperf.cli.workload_options import pop_workload, workload_options
from nnperf.errors import ResourceError, UsageError
from nnperf.hardware import GPU
from nnperf.passes.memory.capacity import capacity
from nnperf.request import model_label


@cli.command()
@workload_options
@memory_step_options
@gpu_options(profile=False)
@click.option("--no-what-ifs", is_flag=True, help="Search only the configuration as given.")
@click.option("--max-batch", type=LimitedInt("max_batch"), default=1 << 20, show_default=True,
              help="Stop searching at this batch.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def fit(gpu: GPU, **kwargs: Any) -> None:
    """The largest batch of MODEL whose step fits in the GPU's memory (the search chooses
    the batch, up to --max-batch; --batch is not used), and how mixed precision, activation checkpointing and a
    stateless optimizer change it.
    """
    from nnperf.search.fit import fit as run_fit
    from nnperf.search.fit import not_fitting_message

    # The search chooses the batch. A --batch within its range (checked when parsed, so
    # --batch 0 is refused) is accepted and not used: scripts pass the same workload options
    # to memory, predict and fit, and the golden cases do too.
    kwargs["batch"] = None
    request, trace_options = pop_workload(kwargs)
    if request.input_spec.given:
        fixed = ", ".join(f"--input-shape {','.join(map(str, s))}" for s in request.input_spec.shapes) or \
            f"--tokens {','.join(map(str, request.input_spec.tokens or ()))}"
        raise UsageError(
            f"fit searches over the batch size, but {fixed} fixes it: check that batch with "
            "'nnperf memory', or give a factory that takes a batch argument"
        )
    options = memory_options_from(trace_options, kwargs)
    with progress.shown("fit: searches done", enabled=not kwargs["as_json"]):
        results = run_fit(request, gpu, options, include_what_ifs=not kwargs["no_what_ifs"],
                          context_mib=context_mib_of(gpu, kwargs), max_batch=kwargs["max_batch"])
    name = results[0].at_one.model
    if kwargs["as_json"]:
        click.echo(json.dumps({"model": name, "gpu": gpu.id, "capacity": capacity(gpu),
                               "results": [r.to_json() for r in results]}, indent=2))
    else:
        from nnperf.report.console import make_console
        from nnperf.report.memory_tables import fit_table

        make_console().print(fit_table(model_label(name, request.overrides), gpu.label, capacity(gpu),
                                       results))
        click.echo("Fits = predicted device total (allocator segments + CUDA context + cuDNN "
                   "workspace estimate) <= GPU memory. Details: nnperf memory MODEL --batch N")
    if results[0].largest is None:
        raise ResourceError(not_fitting_message(name, results, gpu))
