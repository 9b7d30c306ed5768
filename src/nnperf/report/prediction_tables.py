"""Terminal tables for a Prediction: where the time goes and what bounds it.

The Compute and Memory columns are the kernel model's terms, with the profile's
efficiencies (tile and wave quantization, achievable bandwidth): the same numbers that decide
the Bound column, so a row never reads "compute" beside a larger memory time. The ideal
roofline terms (FLOPs / peak, bytes / datasheet bandwidth) stay in ``--json`` as
``compute_s`` and ``memory_s``. Headers are short so a row fits a 100-column terminal.
"""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table

from nnperf.passes.estimates import Estimates
from nnperf.prediction import Prediction
from nnperf.report.analysis_tables import print_assumptions
from nnperf.report.console import make_console
from nnperf.report.labels import indented
from nnperf.report.sections import mfu_label, module_times, op_times
from nnperf.units import binary, rate, seconds, si

#: Bounds under which the bandwidth a row would need to run at peak FLOP/s says something:
#: a launch- or host-bound row (a scalar loss, a tiny layer) is limited by neither, and its
#: "needed bandwidth" (hundreds of TB/s for a few bytes in a few picoseconds) is noise.
_BW_BOUNDS = ("compute", "memory")

MODULE_CAPTION = (
    "Time: kernels + device idle waiting on the host. Compute, Memory: modeled kernel times "
    "(achievable rates, not peaks). Bound: the largest of Compute, Memory, launch overhead "
    "and host wait (the whole model: the step's bound). FLOP/s, %peak: achieved. BW need: B/s "
    "of inputs/outputs/weights to run at peak FLOP/s (compute- and memory-bound rows)."
)
OP_CAPTION = (
    "Compute, Memory: modeled kernel times (achievable rates, not peaks). Bound: the largest "
    "of Compute, Memory, launch overhead and host wait."
)


def _compact(value: float) -> str:
    """'5.89T': a rate without its unit (the header names it) to keep the column narrow."""
    return si(value).replace(" ", "")


def _bw_need(tally: Estimates) -> str:
    req = tally.required_bw()
    if not req or tally.bound not in _BW_BOUNDS:
        return "-"
    return "/".join(_compact(req[k]) if req[k] else "0" for k in ("in", "out", "weights"))


def _table(title: str, first: str, caption: str) -> Table:
    t = Table(title=title, title_justify="left", caption=caption, caption_justify="left",
              box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 1, 0, 0))
    t.add_column(first, no_wrap=True)
    for col in ("Time", "%step", "Bound", "FLOP/s", "%peak", "Compute", "Memory"):
        t.add_column(col, justify="right", no_wrap=True)
    return t


def _cells(tally: Estimates, step: float) -> list[str]:
    return [
        seconds(tally.time_s),
        f"{tally.time_s / step:.1%}" if step else "-",
        tally.bound,
        _compact(tally.achieved_flops),
        f"{tally.fraction_of_peak:.0%}",
        seconds(tally.model_compute_s),
        seconds(tally.model_memory_s),
    ]


def _target(p: Prediction) -> str:
    """The GPU as a header names it, and the host CPU where it is not the default one."""
    host = p.profile.host_label
    return f"{p.gpu.label}, {host}" if host else p.gpu.label


def module_time_table(p: Prediction, depth: int | None) -> Table:
    step = p.step.step_s
    t = _table(f"{p.analysis.label} on {_target(p)} ({p.analysis.options.describe()}) — predicted time per module", "Module",
               MODULE_CAPTION)
    t.add_column("BW need in/out/w", justify="right", no_wrap=True)
    root = p.analysis.root_type
    for row, tally in module_times(p, depth):
        t.add_row(indented(row.name, row.depth, root), *_cells(tally, step), _bw_need(tally))
    return t


def op_time_table(p: Prediction, limit: int = 25) -> Table:
    step = p.step.step_s
    t = _table(f"{p.analysis.label} on {_target(p)} — predicted time per op (top {limit})", "Op",
               OP_CAPTION)
    for name, tally in op_times(p, limit):
        t.add_row(name, *_cells(tally, step))
    return t


def memory_line(p: Prediction) -> str:
    """'145 GiB of 40 GiB: DOES NOT FIT' (the memory model's device total vs the GPU)."""
    fit = p.memory_fit
    digits = 3
    while binary(fit.device_total, digits) == binary(fit.capacity, digits) and digits < 9:
        digits += 1  # 39.4 GiB of 39.4 GiB would read as a fit: show the digits that differ
    return f"{binary(fit.device_total, digits)} of {binary(fit.capacity, digits)}: {fit.verdict}"


def library_settings(p: Prediction) -> str:
    """'TF32 matmuls off, cudnn.benchmark off': the PyTorch switches the prediction assumed
    (``--tf32``, ``--cudnn-benchmark``)."""
    timing = p.timing
    return (f"TF32 matmuls {'on' if timing.tf32_matmul else 'off'}, "
            f"cudnn.benchmark {'on' if timing.cudnn_benchmark else 'off'}")


def summary_table(p: Prediction) -> Table:
    tot = p.totals
    t = Table(title="Step", title_justify="left", show_header=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    t.add_row("step time", seconds(tot["step_time_s"]))
    t.add_row("throughput", rate(tot["throughput"], tot["throughput_unit"]))
    t.add_row("bound", tot["bound"])
    t.add_row(mfu_label(tot), f"{tot['mfu']:.1%}")
    fit = p.memory_fit
    t.add_row("device memory at peak (predicted)", memory_line(p), style=None if fit.fits else "bold red")
    host = f", {p.profile.host}" if p.profile.host else ""
    t.add_row(f"host issue time (eager dispatch{host})", seconds(tot["host_busy_s"]))
    t.add_row("device busy / idle", f"{seconds(tot['device_busy_s'])} / {seconds(tot['device_idle_s'])}")
    t.add_row("kernels", f"{tot['kernels']:,}")
    t.add_row("library settings (assumed)", library_settings(p))
    cov = p.analysis.coverage
    t.add_row("ops with a cost formula", f"{cov['op_share']:.1%} of ops, {cov['byte_share']:.1%} of bytes")
    return t


def print_prediction(p: Prediction, *, by: str = "module", depth: int | None = 2, console: Console | None = None) -> None:
    console = console or make_console()
    console.print(module_time_table(p, depth) if by == "module" else op_time_table(p))
    console.print(summary_table(p))
    console.print(p.track_record.text(), highlight=False, style=None if p.track_record.found else "yellow")
    if not p.memory_fit.fits:
        console.print(f"[bold red]The step does not fit in the {p.gpu.name}'s memory: the times above "
                      "assume it did (see nnperf fit / nnperf memory).[/bold red]")
    uncovered = p.analysis.coverage["uncovered"]
    if uncovered:
        names = ", ".join(f"{u['op']} x{u['count']}" for u in uncovered[:8])
        console.print(f"[yellow]Ops without a cost formula (timed from the bytes they touch): {names}[/yellow]")
    print_assumptions(p.analysis, console)
    for note in p.profile.host_notes:
        console.print(f"[yellow]Note: {note}[/yellow]")
