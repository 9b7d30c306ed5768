"""``nnperf models``: the built-in zoo with default inputs, and the library models by name."""

from __future__ import annotations

import click
from rich.table import Table

from nnperf.cli.app import cli
from nnperf.report.console import make_console


@cli.command()
def models() -> None:
    """List the built-in models and their default inputs."""
    from nnperf.zoo import list_models

    t = Table(title="Built-in models", title_justify="left")
    for col in ("Name", "Family", "Default batch", "Default input", "Options (-O KEY=VALUE)", "Summary"):
        t.add_column(col)
    for spec in list_models():
        t.add_row(
            spec.name, spec.family, str(spec.default_batch), spec.input_desc,
            ", ".join(spec.options), spec.summary,
        )
    make_console().print(t)
    click.echo("Analyze one with: nnperf analyze NAME --batch N [--train|--inference]")
    from nnperf.hub.hf_config import shipped

    ids = sorted({entry.id for entry in shipped().values()}, key=str.lower)
    click.echo(f"\nHugging Face configs shipped with nnperf (hf:ID, offline; needs "
               f"'nnperf[hf]'): {', '.join(ids)}.\nAlso hf:PATH/config.json, any Hub id (cached "
               "or online), timm:NAME ('nnperf[timm]'), tv:NAME ('nnperf[vision]').")
