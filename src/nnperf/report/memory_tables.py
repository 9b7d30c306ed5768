"""Terminal tables for memory reports and fit results. Memory is binary (KiB/MiB/GiB), labeled."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from nnperf.passes.memory import MemoryReport
from nnperf.passes.memory.capacity import MemoryFit
from nnperf.passes.memory.report import Comparison, category_label
from nnperf.report.console import make_console
from nnperf.units import binary


def summary_table(r: MemoryReport, capacity: float | None = None, gpu_name: str = "",
                  model: str | None = None) -> Table:
    """``model``: the name the title shows (``request.model_label``: with ``-O`` changes)."""
    t = Table(title=f"{model or r.model} — peak device memory ({r.source}); sizes in binary units",
              title_justify="left", show_header=False)
    t.add_column("what", style="bold")
    t.add_column("bytes", justify="right")
    t.add_column("meaning")
    where = f"event {r.peak_event}, {r.peak_phase}, module '{r.peak_module or '-'}'"
    t.add_row("peak allocated", binary(r.peak_allocated or 0),
              f"torch.cuda.max_memory_allocated(); at {where}")
    t.add_row("peak reserved (estimate)", binary(r.peak_reserved or 0),
              "torch.cuda.max_memory_reserved(): caching-allocator segments")
    for label, nbytes in r.device_terms.items():
        t.add_row(f"+ {label}", binary(nbytes), "outside the caching allocator")
    t.add_row("device total (estimate)", binary(r.device_total or 0),
              "what nvidia-smi would show for the process", style="bold")
    if capacity:
        fit = MemoryFit(int(r.device_total or 0), int(capacity))
        t.add_row(f"{gpu_name} memory", binary(capacity), f"{fit.share:.0%} used: {fit.verdict}")
    return t


def breakdown_table(r: MemoryReport) -> Table:
    t = Table(title="Breakdown at the peak (tensor bytes before rounding) and model states",
              title_justify="left")
    t.add_column("Category")
    t.add_column("At peak", justify="right")
    t.add_column("Share", justify="right")
    t.add_column("Whole step", justify="right")
    total = r.peak_allocated or 1
    for key, nbytes in r.breakdown.items():
        state = r.model_states.get(key)
        if not nbytes and not state:
            continue
        label = category_label(key)
        t.add_row(label, binary(nbytes), f"{nbytes / total:.1%}",
                  binary(state) if state is not None else "")
    t.add_row("peak allocated", binary(r.peak_allocated or 0), "100%", "", style="bold")
    return t


def saved_table(r: MemoryReport, top: int = 15) -> Table:
    t = Table(title=f"Activations kept for backward, per module (top {top})", title_justify="left")
    t.add_column("Module", no_wrap=True)
    t.add_column("Bytes", justify="right")
    items = list(r.saved_activations.items())
    for module, nbytes in items[:top]:
        t.add_row(module, binary(nbytes))
    rest = sum(v for _, v in items[top:])
    if rest:
        t.add_row(f"({len(items) - top} more modules)", binary(rest))
    t.add_row("total", binary(sum(r.saved_activations.values())), style="bold")
    return t


def timeline_table(r: MemoryReport, rows: int = 24) -> Table:
    """A coarse view of the timeline: the highest point in each of ``rows`` slices."""
    t = Table(title=f"Memory timeline ({r.timeline_events} events; the highest point per slice)",
              title_justify="left")
    for col in ("Event", "Phase", "Module"):
        t.add_column(col, no_wrap=True)
    t.add_column("Allocated", justify="right")
    t.add_column("Reserved", justify="right")
    t.add_column("", no_wrap=True)
    pts = r.timeline
    if not pts:
        return t
    size = -(-len(pts) // rows)
    top = max(p.allocated for p in pts) or 1
    for i in range(0, len(pts), size):
        p = max(pts[i:i + size], key=lambda q: q.allocated)
        bar = "#" * max(1, round(30 * p.allocated / top))
        t.add_row(str(p.index), p.phase, p.module or "-", binary(p.allocated),
                  binary(p.reserved or 0), bar)
    return t


def comparison_table(rows: list[Comparison], title: str) -> Table:
    t = Table(title=title, title_justify="left")
    for col in ("Quantity", "Predicted", "Measured", "Error"):
        t.add_column(col, justify="right" if col != "Quantity" else "left")
    for c in rows:
        err = c.error
        t.add_row(c.quantity, binary(c.predicted) if c.predicted is not None else "-",
                  binary(c.measured) if c.measured is not None else "-",
                  f"{err:+.1%}" if err is not None else "-")
    return t


def print_memory(r: MemoryReport, *, capacity: float | None = None, gpu_name: str = "",
                 timeline_rows: int = 24, console: Console | None = None, model: str | None = None) -> None:
    console = console or make_console()
    console.print(summary_table(r, capacity, gpu_name, model))
    console.print(breakdown_table(r))
    if r.saved_activations:
        console.print(saved_table(r))
    console.print(timeline_table(r, timeline_rows))
    for note in r.notes:
        console.print(f"note: {note}")


def fit_table(model: str, gpu_name: str, capacity: float, results: list) -> Table:
    t = Table(title=f"{model} on {gpu_name} ({binary(capacity)}): largest batch per what-if",
              title_justify="left")
    for col in ("What-if", "Configuration"):
        t.add_column(col)
    for col in ("Largest batch", "Device total", "At batch 1", "Traces", "Time"):
        t.add_column(col, justify="right")
    for r in results:
        if r.largest is None:
            largest, total = "does not fit", "-"
        else:
            largest = (">= " if r.capped else "") + f"{r.largest:,}"
            total = binary(r.at_largest.device_total) if r.at_largest else "-"
        t.add_row(r.label, r.options.describe(), largest, total,
                  binary(r.at_one.device_total or 0), str(len(r.probes)), f"{r.seconds:.1f} s")
    return t
