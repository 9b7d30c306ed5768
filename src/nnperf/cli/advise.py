"""``nnperf advise MODEL --gpu NAME``: what to change, each change predicted with its gain."""

from __future__ import annotations

import json
from typing import Any

import click

from nnperf import progress
from nnperf.cli.app import cli
from nnperf.cli.gpu_options import gpu_options
from nnperf.cli.limits import LimitedInt
from nnperf.cli.paths import check_output, write_output
from nnperf.cli.workload_options import cudnn_benchmark_option, pop_workload, workload_options
from nnperf.errors import UsageError


@cli.command()
@workload_options
@gpu_options
@click.option("--apply", "apply_names", metavar="NAME,...",
              help="Predict these items together (names as the list prints them, or batch-N).")
@click.option("--global-batch", type=LimitedInt("batch"),
              help="Target samples per optimizer step: the gradient accumulation that reaches it.")
@click.option("--set-to-none/--no-set-to-none", default=True, show_default=True,
              help="zero_grad(set_to_none=...) of the training loop as given.")
@click.option("--tf32/--no-tf32", default=False, show_default=True,
              help="fp32 matmuls already on TF32 tensor cores.")
@cudnn_benchmark_option
@click.option("--html", "html_out", type=click.Path(dir_okay=False),
              help="Also write the HTML report with an advice section.")
@click.option("--json", "as_json", is_flag=True, help="Print the advice as JSON.")
def advise(gpu, profile, apply_names, global_batch, set_to_none, tf32, cudnn_benchmark, html_out, as_json,
           **kwargs: Any) -> None:
    """Rank the changes that make one step of MODEL faster on a GPU (padding, batch size,
    precision, optimizer, CUDA graphs, torch.compile, memory format, fused attention,
    recomputation, other GPUs), each re-predicted on the same workload."""
    from nnperf.prediction import timing_options
    from nnperf.search.advise import advise_request
    from nnperf.search.memory_variants import MemoryOptions

    names = None
    if apply_names is not None:
        from nnperf.search.advise.driver import check_apply

        names = [n.strip() for n in apply_names.split(",") if n.strip()]
        if not names:
            raise UsageError("--apply needs item names, e.g. --apply amp-bf16,optimizer-fused")
        check_apply(names)
    if html_out:
        html_out = check_output(html_out, "--html")
    request, trace_options = pop_workload(kwargs)
    options = MemoryOptions(trace_options, set_to_none=set_to_none)
    with progress.shown("advise: changes predicted", enabled=not as_json):
        advice = advise_request(request, options, gpu, profile, timing_options(tf32, cudnn_benchmark),
                                apply=names, global_batch=global_batch)
    if html_out:
        from nnperf.report.html import build_report

        page = build_report(advice.prediction, advice=advice)
        write_output(html_out, "--html", lambda p: p.write_text(page, encoding="utf-8"))
        click.echo(f"wrote {html_out}", err=True)
    if as_json:
        click.echo(json.dumps(advice.to_json(), indent=2, default=str))
        return
    from nnperf.report.advice_tables import print_advice, print_combination
    from nnperf.report.console import make_console

    console = make_console()
    if advice.combination is not None:
        print_combination(advice, console)
    else:
        print_advice(advice, console)
