"""``nnperf compare``: one step on several GPUs side by side, with cost per million samples."""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from rich.table import Table

from nnperf import progress
from nnperf.accuracy import TrackRecord
from nnperf.analysis import analyze_request
from nnperf.cli.app import cli
from nnperf.cli.gpu_options import GpuRequest, GpuTarget, gpu_options
from nnperf.cli.workload_options import cudnn_benchmark_option, pop_workload, workload_options
from nnperf.errors import UsageError, read_user_text, shown
from nnperf.hardware import DeviceProfile
from nnperf.hardware.schema import GPU_RANGES
from nnperf.passes.memory.capacity import verdict
from nnperf.report.console import make_console
from nnperf.search.gpu_costs import gpu_row
from nnperf.units import binary, rate, seconds

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def load_prices(path: str | None) -> dict[str, float]:
    """A user price table: ``h100-sxm = 2.99`` (USD per GPU-hour), overriding catalog defaults."""
    if path is None:
        return {}
    try:
        raw = tomllib.loads(read_user_text(path, "price file", "a TOML file"))
    except tomllib.TOMLDecodeError as err:
        raise UsageError(f"price file {shown(path)} is not valid TOML: {err}") from None
    valid = GPU_RANGES["price_usd_per_hour"]
    prices = {}
    for key, value in raw.items():
        if not valid.admits(value):
            raise UsageError(f"price file {shown(path)}: {shown(key)} is {shown(value)}; expected "
                             f"USD per GPU-hour, {valid.describe()}")
        prices[key] = float(value)
    return prices


@cli.command()
@workload_options
@gpu_options(gpu=False, gpus=True, resolve=False)
@click.option("--prices", "prices_file", type=click.Path(dir_okay=False),
              help="TOML of USD per GPU-hour by GPU name, overriding the catalog's dated defaults.")
@click.option("--tf32/--no-tf32", default=False, show_default=True,
              help="Let fp32 matmuls use TF32 tensor cores where the GPU has them "
                   "(torch.backends.cuda.matmul.allow_tf32).")
@cudnn_benchmark_option
@click.option("--json", "as_json", is_flag=True, help="Print the JSON document instead of the table.")
def compare(gpu_request: GpuRequest, prices_file, tf32, cudnn_benchmark, as_json, **kwargs) -> None:
    """Predict the same step of MODEL on several GPUs (--gpus a,b,...): time, throughput, bound and
    cost."""
    if not gpu_request.given:
        raise UsageError("compare needs the GPUs to compare: --gpus a100,h100 (see 'nnperf gpus')")
    targets = gpu_request.resolve()  # every name, file and what-if checked before the slow trace
    prices = load_prices(prices_file)
    with progress.shown("compare: GPUs predicted", enabled=not as_json):
        progress.expect(len(targets))
        progress.note("tracing the step")
        analysis = analyze_request(*pop_workload(kwargs))
        rows, tracks, refused = _rows(analysis, targets, prices, tf32, cudnn_benchmark)
    if len(refused) == len(targets):
        raise refused[0]
    if as_json:
        click.echo(json.dumps({"schema": "nnperf.compare/1", "model": analysis.model,
                               "config": analysis.config, **_host(targets).host_json(), "gpus": rows},
                              indent=2))
        return
    make_console().print(_table(analysis, rows, tracks, _host(targets).host_label))


def _rows(analysis: Any, targets: list[GpuTarget], prices: dict[str, float], tf32: bool,
          cudnn_benchmark: bool) -> tuple[list[dict[str, Any]], list[TrackRecord | None], list[UsageError]]:
    """A row per GPU with its track record, and the GPUs the step cannot run on (each a row
    saying why too)."""
    from nnperf.prediction import predict_analysis, timing_options

    timing = timing_options(tf32, cudnn_benchmark)
    memory: dict[str | None, Any] = {}  # one memory replay per architecture, not per GPU
    rows = []
    tracks: list[TrackRecord | None] = []
    refused: list[UsageError] = []
    for target in progress.counted(targets):
        gpu = target.gpu
        progress.note(f"predicting on {gpu.name}")
        try:  # a GPU the step cannot run on (bf16 autocast on a V100) is a row saying why
            # the memory model depends on the architecture and nothing else of the GPU
            p = predict_analysis(analysis, gpu, target.profile, timing=timing,
                                 memory=memory.get(gpu.architecture))
        except UsageError as err:
            refused.append(err)
            rows.append({"gpu": target.asked or gpu.id, "id": gpu.id, "error": str(err)})
            tracks.append(None)
            continue
        memory[gpu.architecture] = p.memory
        rows.append({**gpu_row(target.asked or gpu.id, gpu, p.totals, prices),
                     "track_record": p.track_record.to_json()})
        tracks.append(p.track_record)
    return rows, tracks, refused


def _host(targets: list[GpuTarget]) -> DeviceProfile:
    """The profile whose host costs every target uses (``--host`` reaches them all)."""
    return targets[0].profile or DeviceProfile()


def _cost(r: dict[str, Any]) -> str:
    if not r["fits_in_memory"]:
        return "n/a: does not fit"
    return f"{r['usd_per_million_samples']:.3g}" if r["usd_per_million_samples"] else "-"


def _table(analysis: Any, rows: list[dict[str, Any]], tracks: list[TrackRecord | None], host: str = "") -> Table:
    """``tracks``: each row's track record (None for a GPU the step cannot run on)."""
    t = Table(title=f"{analysis.label} ({analysis.trace.mode}, batch {analysis.workload.samples}) across GPUs"
                    + (f", {host}" if host else ""),
              title_justify="left",
              caption="Memory: the memory model's device total (segments, CUDA context, workspaces) "
                      "of GPU memory. Time and throughput assume the step runs. Runs like it: nnperf's "
                      "median error on the measured runs most like this step on that GPU, and how many "
                      "(--json: which runs, its bias).",
              caption_justify="left")
    for col in ("GPU", "Step time", "Runs like it", "Throughput", "Bound", "MFU", "Memory", "Fits",
                "USD/h (date)", "USD per 1M samples"):
        t.add_column(col, justify="left" if col in ("GPU", "Bound", "Fits") else "right")
    for r, track in zip(rows, tracks, strict=True):
        if "error" in r:
            t.add_row(r["gpu"], "-", "-", "-", f"cannot run: {r['error']}", "-", "-", "-", "-", "-", style="dim")
            continue
        price = f"{r['usd_per_hour']:.2f} ({r['price_date'] or 'yours'})" if r["usd_per_hour"] else "-"
        style = None if r["fits_in_memory"] else "red"
        t.add_row(r["gpu"], seconds(r["step_time_s"]), track.cell() if track else "-",
                  rate(r["throughput"], r["throughput_unit"]),
                  r["bound"], f"{r['mfu']:.1%}",
                  f"{binary(r['device_total_bytes'])} of {binary(r['gpu_memory_bytes'])}",
                  verdict(r["fits_in_memory"]), price, _cost(r), style=style)
    return t
