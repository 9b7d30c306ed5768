"""Terminal tables for a Prediction: where the time goes and what bounds it."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from nnperf.prediction import Prediction
from nnperf.report.console import make_console
from nnperf.report.units import si


def _bw(value: float | None) -> str:
    return si(value, "B/s") if value else "-"


def module_time_table(p: Prediction, depth: int | None) -> Table:
    step = p.step.step_s
    t = Table(title=f"{p.analysis.model} on {p.gpu.name} — predicted time per module", title_justify="left")
    t.add_column("Module", no_wrap=True)
    for col in ("Time", "% step", "Bound", "Achieved FLOP/s", "% peak", "Compute (FLOP/peak)",
                "Memory (B/BW)", "BW to stay compute-bound: in / out / weights"):
        t.add_column(col, justify="right")
    tallies = p.by_module(depth)
    for row in p.analysis.modules(depth):
        tally = tallies.get(row.name)
        if tally is None:
            continue
        req = tally.required_bw()
        need = " / ".join(_bw(req[k]) for k in ("in", "out", "weights")) if req else "-"
        t.add_row(
            "  " * max(row.depth - 1, 0) + (row.name or f"({type(p.analysis.workload.model).__name__})"),
            _time(tally.time_s),
            f"{tally.time_s / step:.1%}" if step else "-",
            tally.bound,
            si(tally.achieved_flops, "FLOP/s"),
            f"{tally.fraction_of_peak:.0%}",
            _time(tally.compute_s),
            _time(tally.memory_s),
            need,
        )
    return t


def op_time_table(p: Prediction, limit: int = 25) -> Table:
    step = p.step.step_s
    t = Table(title=f"{p.analysis.model} on {p.gpu.name} — predicted time per op (top {limit})", title_justify="left")
    t.add_column("Op", no_wrap=True)
    for col in ("Time", "% step", "Bound", "Achieved FLOP/s", "% peak", "Compute", "Memory"):
        t.add_column(col, justify="right")
    for name, tally in list(p.by_op().items())[:limit]:
        t.add_row(name, _time(tally.time_s), f"{tally.time_s / step:.1%}" if step else "-", tally.bound,
                  si(tally.achieved_flops, "FLOP/s"), f"{tally.fraction_of_peak:.0%}",
                  _time(tally.compute_s), _time(tally.memory_s))
    return t


def summary_table(p: Prediction) -> Table:
    tot = p.totals
    t = Table(title="Step", title_justify="left", show_header=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    t.add_row("step time", _time(tot["step_time_s"]))
    t.add_row("throughput", f"{tot['throughput']:,.4g} {tot['throughput_unit']}")
    t.add_row("bound", tot["bound"])
    t.add_row(f"MFU (model FLOPs / {tot['mfu_dtype']} peak {si(tot['mfu_peak_flops'], 'FLOP/s')})", f"{tot['mfu']:.1%}")
    t.add_row("host issue time (eager dispatch)", _time(tot["host_s"]))
    t.add_row("device busy / idle", f"{_time(tot['device_busy_s'])} / {_time(tot['device_idle_s'])}")
    t.add_row("kernels", f"{tot['kernels']:,}")
    cov = p.analysis.coverage
    t.add_row("ops with a cost formula", f"{cov['op_share']:.1%} of ops, {cov['byte_share']:.1%} of bytes")
    return t


def _time(seconds: float) -> str:
    from nnperf.report.units import seconds as fmt

    return fmt(seconds)


def print_prediction(p: Prediction, *, by: str = "module", depth: int | None = 2, console: Console | None = None) -> None:
    console = console or make_console()
    console.print(module_time_table(p, depth) if by == "module" else op_time_table(p))
    console.print(summary_table(p))
    uncovered = p.analysis.coverage["uncovered"]
    if uncovered:
        names = ", ".join(f"{u['op']} x{u['count']}" for u in uncovered[:8])
        console.print(f"[yellow]Ops without a cost formula (timed from the bytes they touch): {names}[/yellow]")
