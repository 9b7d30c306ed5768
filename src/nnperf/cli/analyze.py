"""``nnperf analyze``: count one step (FLOPs, bytes, parameters, activations) per module."""

from __future__ import annotations

import json

import click

from nnperf.analysis import analyze_request
from nnperf.cli.app import cli
from nnperf.cli.limits import LimitedInt
from nnperf.cli.workload_options import pop_workload, workload_options
from nnperf.errors import UsageError


@cli.command()
@workload_options
@click.option("--by", type=click.Choice(["module", "op", "gemm"]), default="module", show_default=True,
              help="Rows of the table: modules (to --depth), aten ops, or GEMM shapes.")
@click.option("--depth", type=LimitedInt("depth"), default=2, show_default=True,
              help="Module tree depth shown (0: the whole model only).")
@click.option("--json", "as_json", is_flag=True, help="Print the JSON document instead of tables.")
@click.option("--csv", "as_csv", is_flag=True, help="Print the --by table as CSV.")
def analyze(**kwargs) -> None:
    """Trace MODEL on fake tensors and count FLOPs, bytes and parameters.

    MODEL is a built-in name (see `nnperf models`), path/to/file.py:factory or
    package.module:factory.
    """
    if kwargs["as_json"] and kwargs["as_csv"]:
        raise UsageError("--json and --csv are two output formats: choose one")
    result = analyze_request(*pop_workload(kwargs))
    if kwargs["as_json"]:
        click.echo(json.dumps(result.to_json(depth=kwargs["depth"]), indent=2))
    elif kwargs["as_csv"]:
        click.echo(result.to_csv(by=kwargs["by"], depth=kwargs["depth"]), nl=False)
    else:
        from nnperf.report.analysis_tables import print_analysis

        print_analysis(result, by=kwargs["by"], depth=kwargs["depth"])
