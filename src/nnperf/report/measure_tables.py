"""Terminal tables for measurements: measured beside predicted, calibration and transfer."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from nnperf.report.console import make_console
from nnperf.report.labels import indented
from nnperf.units import binary, seconds, si


def _t(value: float | None) -> str:
    return "-" if value is None else seconds(value)


def _err(value: float | None) -> str:
    return "-" if value is None else f"{value:+.0%}"


def print_measurement(doc: dict[str, Any], *, console: Console | None = None) -> None:
    """Per-module and step tables from ``runner.combined_json``'s document."""
    console = console or make_console()
    m = doc["measurement"]
    key = m["module_time_compared_with"]
    has_pred = doc["prediction_available"]
    where = f"{m['device_name']} ({m['device']})"
    vs = f" vs predicted on {doc['gpu']['name']}" if has_pred else ""
    t = Table(title=f"{doc['model']} ({m['mode']}, batch {m['batch']}) measured on {where}{vs}", title_justify="left")
    t.add_column("Module", no_wrap=True)
    for col in ("Measured", f"Predicted ({key})", "Error"):
        t.add_column(col, justify="right")
    root = next((row["type"] for row in doc["modules"] if row["name"] == ""), "model")
    for row in doc["modules"]:
        name = indented(row["name"], row["depth"], root)  # "(Net)" as predict and analyze say
        measured = row.get("measured_time_s")
        shown = "not matched" if measured is None and m.get("attribution") else _t(measured)
        t.add_row(name, shown, _t(row.get(key)) if has_pred else "-", _err(row.get("error")))
    console.print(t)
    _print_unmatched(m.get("attribution"), console)
    tot = doc["totals"]
    s = tot["measured_step_time_spread"]
    summary = Table(title="Step", title_justify="left", show_header=False)
    summary.add_column("what")
    summary.add_column("value", justify="right")
    summary.add_row("measured step time (median)", seconds(s["median"]))
    summary.add_row("spread: p10 / p90 (IQR)", f"{seconds(s['p10'])} / {seconds(s['p90'])} ({seconds(s['iqr'])})")
    summary.add_row("timed steps", str(s["n"]))
    if m.get("back_to_back_step_s") is not None:
        summary.add_row("step back to back (host clock, one sync)", seconds(m["back_to_back_step_s"]))
    summary.add_row("library settings", f"TF32 matmuls {'on' if m.get('tf32') else 'off'}, "
                                        f"cudnn.benchmark {'on' if m.get('cudnn_benchmark') else 'off'}")
    if has_pred:
        summary.add_row(f"predicted step time on {doc['gpu']['name']}", seconds(tot["step_time_s"]))
        summary.add_row("error (predicted vs measured)", _err(tot["step_time_error"]))
    mem = tot["measured_peak_memory_bytes"]
    method = tot["measured_memory_method"]
    summary.add_row(f"measured peak memory ({method})", binary(mem) if mem is not None else "not available")
    pred_mem = tot.get("predicted_peak_memory_bytes")
    what = "live tensors" if m["device"].startswith("cpu") else "allocated"
    summary.add_row(f"predicted peak memory ({what})", binary(pred_mem) if pred_mem else "-")
    mem_err = tot.get("peak_memory_error")
    summary.add_row("memory error (predicted vs measured)", "-" if mem_err is None else f"{mem_err:+.1%}")
    att = m.get("attribution")
    if att:
        summary.add_row("op time attributed to traced ops", f"{att['attributed_share_of_op_time']:.1%}")
        summary.add_row("op time not attributed", seconds(att["unmatched_s"]))
        share = m.get("attributed_share_of_step")
        if share is not None:
            summary.add_row("share of the profiled step attributed", f"{share:.1%}")
    console.print(summary)
    if not has_pred:
        console.print(f"[yellow]{doc.get('prediction_note', 'No prediction for this device.')}[/yellow]")


def _print_unmatched(attribution: dict[str, Any] | None, console: Console) -> None:
    """Say which traced ops found no profiled op and which profiled ops are not in the trace
    (the device ran other kernels: on the CPU dropout is bernoulli_ and mul, attention with
    dropout the math path), rather than leave their time at zero."""
    if not attribution:
        return
    trace_only = attribution.get("trace_only") or {}
    profiler_only = attribution.get("profiler_only") or {}
    if trace_only:
        names = ", ".join(f"{op} x{n}" for op, n in list(trace_only.items())[:6])
        console.print(f"[yellow]Traced ops not found in the profile (not matched): {names}[/yellow]")
    if profiler_only:
        names = ", ".join(f"{op} {seconds(t)}" for op, t in list(profiler_only.items())[:6])
        console.print(f"[yellow]Profiled ops not in the trace (their time is unattributed): {names}[/yellow]")


def print_calibration(cal: Any, measured: dict[str, Any], paths: list[str], *, console: Console | None = None) -> None:
    console = console or make_console()
    t = Table(title=f"Calibration of {cal.device_name} ({cal.device})", title_justify="left")
    t.add_column("GEMM dtype")
    for col in ("n", "square", "n+1 (misaligned)", f"M={cal.gemm[0]['m'] if cal.gemm and cal.gemm[0]['kind'] == 'skinny' else 'small'} skinny"):
        t.add_column(col, justify="right")
    rows: dict[tuple[str, int], dict[str, float]] = {}
    for g in cal.gemm:
        n = g["k"] - 1 if g["kind"] == "misaligned" else g["k"]
        rows.setdefault((g["dtype"], n), {})[g["kind"]] = g["flops_per_s"]
    for (dtype, n), kinds in rows.items():
        t.add_row(dtype, str(n), *(si(kinds.get(k, 0.0), "FLOP/s") for k in ("square", "misaligned", "skinny")))
    console.print(t)
    s = Table(title="Summary", title_justify="left", show_header=False)
    s.add_column("what")
    s.add_column("value", justify="right")
    for key, value in measured.items():
        s.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
    console.print(s)
    for p in paths:
        console.print(f"wrote {p}")


def print_transfer(result: dict[str, Any], *, console: Console | None = None) -> None:
    console = console or make_console()
    gpu = result["gpu_name"]
    t = Table(title=f"n x n fp32 matrix product: CPU (NumPy) vs GPU ({gpu})", title_justify="left")
    for col in ("n", "CPU measured", "CPU predicted", "GPU resident measured", "GPU resident predicted",
                "GPU + copies measured", "GPU + copies predicted"):
        t.add_column(col, justify="right")
    for r in result["rows"]:
        t.add_row(str(r["n"]), _t(r["cpu_s"]), _t(r["predicted_cpu_s"]), _t(r["gpu_resident_s"]),
                  _t(r["predicted_gpu_resident_s"]), _t(r["gpu_with_copies_s"]), _t(r["predicted_gpu_with_copies_s"]))
    console.print(t)
    c = result["crossover"]

    def n(v: int | None) -> str:
        return "-" if v is None else f"n >= {v}"

    x = Table(title="Crossover (GPU faster than the CPU from this n on)", title_justify="left")
    for col in ("", "measured", "predicted"):
        t_just = "left" if not col else "right"
        x.add_column(col, justify=t_just)
    x.add_row("GPU, data resident", n(c["measured_resident"]), n(c["predicted_resident"]))
    x.add_row("GPU, copies each time", n(c["measured_with_copies"]), n(c["predicted_with_copies"]))
    console.print(x)
    console.print(f"predicted CPU side: {result['cpu_prediction']}; copies: {result['host_link_gbs']:g} GB/s host link "
                  f"+ {result['transfer_latency_s'] * 1e6:g} µs per copy")
    if result.get("note"):
        console.print(f"[yellow]{result['note']}[/yellow]")
