"""``nnperf advise`` in the terminal: the ranked code changes, what gains nothing, the batch
curve, and the same step on other GPUs (a table of its own: a purchase is not a code change)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from nnperf.report.sections import (
    AdviceRow,
    advice_gpu_rows,
    advice_rows,
    gpus_not_compared,
    share_text,
)
from nnperf.units import binary, rate, seconds


def _memory(r: AdviceRow) -> str:
    if r.memory_after is None or r.memory_before is None:
        return "-"
    return f"{binary(r.memory_before)} -> {binary(r.memory_after)}" + ("" if r.fits is not False else " (no fit)")


def _gain(r: AdviceRow) -> str:
    if r.gain_s is None or r.gain_share is None:
        return r.note or "-"
    sign = "-" if r.gain_s < 0 else "+"
    return f"{sign}{seconds(abs(r.gain_s))} ({share_text(r.gain_share)})"  # "-1.27 s", never "-1.27e+03 ms"


def _host(advice: Any) -> str:
    """', host epyc-7742' where the host CPU is not the default one, else ''."""
    host = (getattr(advice, "host", None) or {}).get("host")
    return f", host {host}" if host else ""


def advice_table(advice: Any, rows: list[AdviceRow]) -> Table:
    base = advice.base
    fit = "" if base.fits is not False else (
        " — DOES NOT FIT as given: the changes that make it fit say so in 'peak memory'")
    t = Table(title=f"Code changes for {advice.model_label or advice.model} on {advice.gpu}{_host(advice)}: step {seconds(base.step_s)}, "
                    f"{rate(base.throughput, base.throughput_unit)}, {base.bound}-bound, "
                    f"peak {binary(base.peak_bytes or 0)}{fit}", title_justify="left",
              caption="Gain: time saved per step of the given batch (per-sample times). Ranked items first; "
                      "then the changes checked that gain nothing, then those not predicted. "
                      "--json gives each item's exact change, layers and assumptions.",
              caption_justify="left")
    for col in ("#", "item", "step time", "gain", "throughput", "peak memory", "bound", "change"):
        t.add_column(col, justify="right" if col in ("#", "step time", "gain") else "left", overflow="fold")
    for r in rows:
        after = seconds(r.after_s) if r.after_s is not None else "-"
        tput = rate(r.throughput_after, r.throughput_unit) if r.throughput_after is not None else "-"
        style = None if r.rank else "dim"
        gain = _gain(r) if r.fits is not False else "none: does not fit"
        t.add_row(str(r.rank or ""), r.name, after, gain, tput, _memory(r), r.bound,
                  escape(r.change.splitlines()[0]), style=style)
    return t


def _usd(r: AdviceRow) -> str:
    if r.usd_per_million is None:
        return "-" if r.fits is not False else "(no fit)"
    return f"{r.usd_per_million:.3g}" + (f" (now {r.given_usd_per_million:.3g})" if r.given_usd_per_million else "")


def gpu_table(advice: Any, rows: list[AdviceRow]) -> Table:
    """The same traced step on the other catalog GPUs, fastest first."""
    t = Table(title=f"The same step on other GPUs (given: {advice.gpu}, {seconds(advice.base.step_s)})",
              title_justify="left",
              caption="Not a code change: the step as given, timed on each catalog GPU. USD per million "
                      "samples from the catalog's dated price per GPU-hour, where the step fits.",
              caption_justify="left")
    for col in ("#", "GPU", "step time", "vs given", "throughput", "peak memory", "bound", "USD / M samples"):
        t.add_column(col, justify="right" if col in ("#", "step time", "vs given") else "left", overflow="fold")
    for r in rows:
        after = seconds(r.after_s) if r.after_s is not None else "-"
        tput = rate(r.throughput_after, r.throughput_unit) if r.throughput_after is not None else "-"
        t.add_row(str(r.rank or ""), r.change.removeprefix("--gpu "), after, _gain(r), tput, _memory(r), r.bound,
                  _usd(r), style=None if r.fits is not False else "dim")
    return t


def print_track_record(advice: Any, console: Console) -> None:
    """Under the headline step time: how nnperf did on measured runs like it."""
    if advice.prediction is not None:
        record = advice.prediction.track_record
        console.print(f"  the given step: {record.text()}", highlight=False, style=None if record.found else "yellow")


def print_advice(advice: Any, console: Console) -> None:
    console.print(advice_table(advice, advice_rows(advice)))
    print_track_record(advice, console)
    for name, why in advice.checked:
        console.print(f"  checked, gains nothing: {name}: {why}")
    if advice.curve:
        parts = [f"{b}: {rate(o.throughput, o.throughput_unit)}" for b, o in sorted(advice.curve.items())]
        console.print(f"batch curve (largest that fits {advice.largest_batch}, knee {advice.knee}): "
                      + ", ".join(parts))
    if advice.accumulation:
        a = advice.accumulation
        console.print(f"gradient accumulation: global batch {a.split.global_batch} = {a.split.steps} x "
                      f"micro-batch {a.split.micro_batch}: {seconds(a.time_s)} per optimizer step, "
                      f"{a.samples_per_s:.4g} samples/s")
    gpus = advice_gpu_rows(advice)
    if gpus:
        console.print(gpu_table(advice, gpus))
    for line in gpus_not_compared(advice):
        console.print(f"  GPUs not compared: {line}", highlight=False)


def print_combination(advice: Any, console: Console) -> None:
    item = advice.combination
    rows = [r for r in advice_rows(_Only(advice, item))]
    console.print(advice_table(advice, rows))
    print_track_record(advice, console)
    lines = item.candidate.how.splitlines()
    if len(lines) > 1:  # the table shows a change's first line; a combination has one per item
        console.print("  changes:\n" + "\n".join(f"    {escape(line)}" for line in lines))
    for a in item.candidate.assumptions:
        console.print(f"  assumes: {escape(a)}")


class _Only:
    """An advice with one ranked item (the combination), for the same table."""

    def __init__(self, advice: Any, item: Any) -> None:
        if item.after is None:
            self.items, self.nothing, self.unpredicted = [], [], [item]
        else:  # ranked as a gain by the rule the full advice ranks by: it saves time and fits
            self.items, self.nothing, self.unpredicted = ([item], [], []) if item.ranked else ([], [item], [])
        self.gpus: list[Any] = []
        self.base, self.model, self.gpu = advice.base, advice.model, advice.gpu
        self.model_label = getattr(advice, "model_label", "")
        self.host = getattr(advice, "host", {})
        self.prediction = getattr(advice, "prediction", None)
