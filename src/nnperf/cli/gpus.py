"""``nnperf gpus [NAME]``: the GPU catalog, or one entry in full with its sources."""

from __future__ import annotations

import json

import click
from rich.table import Table

from nnperf.cli.app import cli
from nnperf.errors import UsageError
from nnperf.hardware import GPU, list_gpus, load_gpu
from nnperf.report.console import make_console


def _tf(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _half(gpu: GPU) -> str:
    """The 16-bit tensor rate: bf16 when the GPU has it, else fp16 (labelled)."""
    if "bf16" in gpu.tensor_tflops:
        return _tf(gpu.tensor_tflops["bf16"])
    if "fp16" in gpu.tensor_tflops:
        return f"{gpu.tensor_tflops['fp16']:g} (fp16)"
    return "-"


#: Marks a catalog row whose values are not all checked against a primary source.
UNVERIFIED_MARK = " (?)"


def _unverified(gpu: GPU) -> bool:
    return gpu.confidence != "datasheet"


def _catalog_table(gpus: list[GPU]) -> Table:
    t = Table(
        title="GPU catalog (dense peak TFLOP/s; fp32 on CUDA cores, the rest on tensor cores)",
        title_justify="left",
    )
    for col in (
        "ID",
        "Name",
        "Arch",
        "SMs",
        "FP32",
        "TF32",
        "BF16/FP16",
        "FP8",
        "Memory",
        "GB/s",
        "L2 MB",
        "$/h",
    ):
        t.add_column(col, justify="left" if col in ("ID", "Name", "Arch") else "right")
    for g in gpus:
        t.add_row(
            g.id + (UNVERIFIED_MARK if _unverified(g) else ""),
            g.name,
            g.architecture,
            str(g.sm_count),
            _tf(g.cuda_tflops.get("fp32")),
            _tf(g.tensor_tflops.get("tf32")),
            _half(g),
            _tf(g.tensor_tflops.get("fp8")),
            f"{g.memory_gib:g} GiB {g.memory_type}",
            f"{g.memory_bandwidth_gbs:g}",
            _tf(g.l2_mb),
            "-" if g.price_usd_per_hour is None else f"{g.price_usd_per_hour:.2f}",
        )
    return t


def _detail_table(g: GPU) -> Table:
    t = Table(title=f"{g.name} ({g.id})", title_justify="left", show_header=False)
    t.add_column("field", style="bold")
    t.add_column("value")
    rows = [
        ("aliases", ", ".join(g.aliases)),
        ("vendor / architecture", f"{g.vendor} {g.architecture}"),
        ("segment", g.segment or "-"),
        ("compute capability", g.compute_capability or "-"),
        ("SMs (CUs on AMD)", str(g.sm_count)),
        ("boost clock", f"{g.boost_clock_mhz:g} MHz"),
        ("tensor peaks quoted at", f"{_tf(g.tensor_clock_mhz)} MHz"),
        ("sustained clock (peaks scaled to it)", f"{_tf(g.sustained_clock_mhz)} MHz"),
    ]
    for unit, rates in (("tensor", g.tensor_tflops), ("cuda", g.cuda_tflops)):
        for dtype, value in rates.items():
            label = "TOPS" if dtype == "int8" else "TFLOP/s"
            rows.append((f"peak {unit} {dtype}", f"{value:g} {label} (dense)"))
    rows += [
        ("memory", f"{g.memory_gib:g} GiB {g.memory_type} ({g.memory_gb:.1f} GB)"),
        ("memory bandwidth", f"{g.memory_bandwidth_gbs:g} GB/s"),
        ("L2", f"{_tf(g.l2_mb)} MB"),
        ("L2 reuse (measured)", f"{g.l2_reuse_mb:g} MB found by later kernels, read at {g.l2_bandwidth_gbs:g} GB/s"
         if g.l2_reuse else "not modeled (no L2 microbenchmark): every read is timed at DRAM bandwidth"),
        ("host link", g.host_link.describe() if g.host_link else "-"),
        ("GPU link (total)", f"{_tf(g.gpu_link_gbs)} GB/s"),
        ("TDP", f"{_tf(g.tdp_w)} W"),
        (
            "price",
            "-"
            if g.price_usd_per_hour is None
            else f"{g.price_usd_per_hour:.2f} USD/h (on-demand, {g.price_date or 'undated'})",
        ),
        (
            "confidence",
            g.confidence + (f"; not re-checked: {', '.join(g.unverified)}" if g.unverified else ""),
        ),
        ("notes", g.notes or "-"),
    ]
    if g.overrides:
        rows.append(("what-if overrides", ", ".join(g.overrides)))
    rows += [(f"source: {k}", v) for k, v in g.sources.items()]
    rows.append(("file", g.origin))
    for row in rows:
        t.add_row(*row)
    return t


@cli.command()
@click.argument("name", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def gpus(name: str | None, as_json: bool) -> None:
    """List the GPU catalog, or show NAME in full with its sources."""
    if name is not None:
        if not name.strip():
            raise UsageError(f"GPU name {name!r} is empty; give a name such as h100, or none for "
                             "the whole catalog")
        gpu = load_gpu(name)
        if as_json:
            click.echo(json.dumps(gpu.to_dict(), indent=2))
        else:
            make_console().print(_detail_table(gpu))
        return
    catalog = list_gpus()
    if as_json:
        click.echo(json.dumps([g.to_dict() for g in catalog], indent=2))
        return
    make_console().print(_catalog_table(catalog))
    click.echo(_footer(catalog))


def _footer(catalog: list[GPU]) -> str:
    """Where the details are, and what "(?)" means only when a row carries it: a legend for a
    marker that appears nowhere sends the reader looking for it."""
    legend = (f"{UNVERIFIED_MARK.strip()} = values not all re-checked against a primary source. "
              if any(_unverified(g) for g in catalog) else "")
    return f"{legend}Details and sources: nnperf gpus NAME"
