"""Terminal tables for an Analysis (rich). Every column names its unit; FLOPs are 2 x MACs."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from nnperf.analysis import Analysis
from nnperf.report.console import make_console
from nnperf.report.labels import indented
from nnperf.units import binary, count, si


def module_table(a: Analysis, depth: int | None) -> Table:
    """Per module: FLOPs per phase and in total (the total column is where the optimizer's
    FLOPs, which are neither forward nor backward, show on the (optimizer) row)."""
    t = Table(title=f"{a.label} — per module ({a.options.describe()}); FLOP = 2 x MAC", title_justify="left")
    for col in ("Module", "Type"):
        t.add_column(col, no_wrap=True)
    for col in ("Params", "Param mem", "Output mem", "FLOP fwd", "FLOP bwd", "FLOP total", "Bytes moved",
                "FLOP/B"):
        t.add_column(col, justify="right")
    root = a.root_type
    for row in a.modules(depth):
        tally = row.tally
        t.add_row(
            indented(row.name, row.depth, root),
            row.type,
            count(row.params),
            binary(row.param_bytes),
            binary(row.output_bytes),
            si(tally.flops_forward),
            si(tally.flops_backward),
            si(tally.flops),
            binary(tally.bytes),
            f"{tally.intensity:.1f}",
        )
    return t


def phase_table(a: Analysis) -> Table:
    t = Table(title="Totals per phase", title_justify="left")
    t.add_column("Phase")
    for col in ("Ops", "FLOP", "MAC", "Bytes moved", "inputs", "weights", "outputs", "FLOP/B"):
        t.add_column(col, justify="right")
    phases = a.phases()
    shown = [p for p, tally in phases.items() if tally.count]
    for name in shown:
        tally = phases[name]
        t.add_row(
            name,
            count(tally.count),
            si(tally.flops),
            si(tally.macs),
            binary(tally.bytes),
            binary(tally.bytes_in),
            binary(tally.bytes_weights),
            binary(tally.bytes_out),
            f"{tally.intensity:.1f}",
        )
    tot = a.totals
    t.add_row(
        "step",
        count(tot["ops"]),
        si(tot["flops"]),
        si(tot["macs"]),
        binary(tot["bytes"]),
        binary(tot["bytes_in"]),
        binary(tot["bytes_weights"]),
        binary(tot["bytes_out"]),
        f"{tot['flops'] / tot['bytes'] if tot['bytes'] else 0:.1f}",
        style="bold",
    )
    return t


def op_table(a: Analysis) -> Table:
    t = Table(title=f"{a.label} — per op", title_justify="left")
    t.add_column("Op", no_wrap=True)
    for col in ("Count", "FLOP", "MAC", "Bytes moved", "FLOP/B"):
        t.add_column(col, justify="right")
    for name, tally in a.op_table().items():
        t.add_row(name, count(tally.count), si(tally.flops), si(tally.macs), binary(tally.bytes), f"{tally.intensity:.1f}")
    return t


def gemm_table(a: Analysis) -> Table:
    t = Table(title=f"{a.label} — GEMMs ({len(a.gemms)})", title_justify="left")
    for col in ("Module", "Phase", "Role", "Op"):
        t.add_column(col, no_wrap=True)
    for col in ("M", "N", "K", "Batch", "dtype", "FLOP"):
        t.add_column(col, justify="right")
    for g in a.gemms:
        t.add_row(g.module or "-", g.phase, g.role, g.op, count(g.m), count(g.n), count(g.k), count(g.batch), g.dtype, si(g.flops))
    return t


def coverage_table(a: Analysis) -> Table:
    cov = a.coverage
    t = Table(
        title=(
            f"Coverage: {cov['modeled']}/{cov['ops']} ops modeled ({cov['op_share']:.1%}), "
            f"{cov['byte_share']:.1%} of bytes touched; ops without a formula:"
        ),
        title_justify="left",
        min_width=90,
    )
    t.add_column("Op")
    t.add_column("Count", justify="right")
    t.add_column("Bytes touched", justify="right")
    for u in cov["uncovered"]:
        t.add_row(u["op"], count(u["count"]), binary(u["bytes"]))
    if not cov["uncovered"]:
        t.add_row("(none)", "0", "0 B")
    return t


def print_analysis(a: Analysis, *, by: str = "module", depth: int | None = 2, console: Console | None = None) -> None:
    console = console or make_console()
    main = {"module": lambda: module_table(a, depth), "op": lambda: op_table(a), "gemm": lambda: gemm_table(a)}[by]
    console.print(main())
    console.print(phase_table(a))
    console.print(coverage_table(a))
    print_assumptions(a, console)


def print_assumptions(a: Analysis, console: Console) -> None:
    """What the trace assumed (MoE routing, an option that changed nothing): a user reading
    the tables must see it, not only the JSON."""
    for note in a.config.get("assumptions", []):
        console.print(f"[yellow]Note: {note}[/yellow]")
