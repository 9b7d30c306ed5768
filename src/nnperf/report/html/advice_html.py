"""The advice section of the HTML report, rendered from ``report.sections.advice_rows``:
formatting only. Every user string (module names, the change text) goes through ``esc``."""

from __future__ import annotations

from typing import Any

from nnperf.report.html.svg import esc
from nnperf.report.sections import (
    AdviceRow,
    advice_gpu_rows,
    advice_rows,
    gpus_not_compared,
    share_text,
)
from nnperf.units import binary, rate, seconds


def _row(r: AdviceRow) -> str:
    gain = (f"{r.gain_s * 1e3:+.3g} ms ({esc(share_text(r.gain_share))})"
            if r.gain_s is not None and r.gain_share is not None else esc(r.note or "-"))
    after = esc(seconds(r.after_s)) if r.after_s is not None else "-"
    tput = esc(rate(r.throughput_after, r.throughput_unit)) if r.throughput_after is not None else "-"
    mem = (f"{esc(binary(r.memory_before))} &rarr; {esc(binary(r.memory_after))}"
           if r.memory_after is not None and r.memory_before is not None else "-")
    details = (f"<details><summary>{esc(r.title)}</summary><pre>{esc(r.change)}</pre>"
               f"<p>layers: {esc(', '.join(r.layers[:8]) or '-')}</p><ul>"
               + "".join(f"<li>{esc(a)}</li>" for a in r.assumptions) + "</ul></details>")
    cls = "" if r.rank else ' class="dim"'
    return (f"<tr{cls}><td>{r.rank or ''}</td><td>{esc(r.name)}</td><td>{after}</td><td>{gain}</td>"
            f"<td>{tput}</td><td>{mem}</td><td>{esc(r.bound)}</td><td>{details}</td></tr>")


def _gpu_row(r: AdviceRow) -> str:
    gain = (f"{r.gain_s * 1e3:+.3g} ms ({esc(share_text(r.gain_share))})"
            if r.gain_s is not None and r.gain_share is not None else esc(r.note or "-"))
    after = esc(seconds(r.after_s)) if r.after_s is not None else "-"
    tput = esc(rate(r.throughput_after, r.throughput_unit)) if r.throughput_after is not None else "-"
    mem = esc(binary(r.memory_after)) + ("" if r.fits is not False else " (no fit)") if r.memory_after else "-"
    usd = f"{r.usd_per_million:.3g}" if r.usd_per_million is not None else "-"
    cls = "" if r.fits is not False else ' class="dim"'
    return (f"<tr{cls}><td>{r.rank or ''}</td><td>{esc(r.change.removeprefix('--gpu '))}</td><td>{after}</td>"
            f"<td>{gain}</td><td>{tput}</td><td>{mem}</td><td>{esc(r.bound)}</td><td>{usd}</td></tr>")


def gpu_section(advice: Any) -> str:
    """The same step on other GPUs: its own table, never ranked among code changes."""
    rows = advice_gpu_rows(advice)
    left_out = "".join(f"<p>GPUs not compared: {esc(line)}</p>" for line in gpus_not_compared(advice))
    if not rows:
        return left_out
    head = "".join(f"<th>{h}</th>" for h in ("#", "GPU", "step time", "vs given", "throughput", "peak memory",
                                            "bound", "USD per million samples"))
    given = advice.base
    mine = rows[0].given_usd_per_million
    return (f"<h3>The same step on other GPUs</h3><p>Not a code change: the step as given "
            f"({esc(seconds(given.step_s))} on {esc(advice.gpu)}"
            + (f", {mine:.3g} USD per million samples" if mine else "")
            + ") timed on each catalog GPU, fastest first.</p>"
            f'<table class="advice"><thead><tr>{head}</tr></thead><tbody>'
            + "".join(_gpu_row(r) for r in rows) + "</tbody></table>" + left_out)


def advice_section(advice: Any) -> str:
    rows = advice_rows(advice)
    head = "".join(f"<th>{h}</th>" for h in ("#", "item", "step time", "gain", "throughput",
                                            "peak memory", "bound", "change and assumptions"))
    checked = "".join(f"<li>{esc(n)}: {esc(w)}</li>" for n, w in advice.checked)
    curve = ", ".join(f"{b}: {esc(rate(o.throughput, o.throughput_unit))}" for b, o in sorted(advice.curve.items()))
    base = advice.base
    return (f"<p>As given: step {esc(seconds(base.step_s))}, {esc(rate(base.throughput, base.throughput_unit))}, "
            f"{esc(base.bound)}-bound. Gain = time saved per step of the given batch; the dimmed rows were "
            "checked and gain nothing, or are not predicted.</p>"
            f'<table class="advice"><thead><tr>{head}</tr></thead><tbody>'
            + "".join(_row(r) for r in rows) + "</tbody></table>"
            + (f"<p>Batch curve (largest that fits {advice.largest_batch}, knee {advice.knee}): {curve}</p>"
               if curve else "")
            + (f"<ul>{checked}</ul>" if checked else "")
            + gpu_section(advice))
