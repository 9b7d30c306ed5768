"""The HTML of each report section, rendered from ``report.sections`` (the data computed once
per GPU): formatting only. Every user string goes through ``esc`` (see ``page``)."""

from __future__ import annotations

from typing import Any

from nnperf.kernels.gemm import tile_text
from nnperf.passes.memory.capacity import capacity
from nnperf.passes.memory.report import category_label
from nnperf.passes.rollup import ROOT_OWN_OPS
from nnperf.prediction import Prediction
from nnperf.report.html.svg import esc, memory_svg, roofline_svg
from nnperf.report.labels import module_label
from nnperf.report.roofline import BOUND_COLORS
from nnperf.report.sections import Run, mfu_label
from nnperf.units import binary, rate, seconds, si


def _card(key: str, value: str, more: str = "", cls: str = "") -> str:
    extra = f'<div class="m">{more}</div>' if more else ""
    return f'<div class="card {cls}"><div class="k">{esc(key)}</div><div class="v">{value}</div>{extra}</div>'


def memory_fit(run: Run) -> tuple[str, str, str]:
    """(verdict, detail, css class) for the summary: predicted device memory vs capacity."""
    fit = run.fit
    if fit is None:
        return "not available", esc(run.memory_note or "no memory prediction"), "na"
    return (
        f"{'fits' if fit.fits else 'does not fit'} ({fit.share:.0%})",
        f"{esc(binary(run.peak_memory()))} of {esc(binary(fit.capacity))}",
        "ok" if fit.fits else "bad",
    )


def summary_section(run: Run) -> str:
    tot = run.totals
    cov = run.prediction.analysis.coverage
    m = run.measured
    measured_step = m.step_time_s if m else None
    step_more = (f"measured {esc(seconds(measured_step))} "
                 f"({(tot['step_time_s'] - measured_step) / measured_step:+.0%} predicted vs measured)"
                 if measured_step else "measured: not available")
    fit, fit_more, fit_cls = memory_fit(run)
    cards = [
        _card("step time (predicted)", esc(seconds(tot["step_time_s"])), step_more),
        _card("throughput", esc(rate(tot["throughput"], tot["throughput_unit"])), _samples_line(tot)),
        _card("MFU", esc(f"{tot['mfu']:.1%}"), esc(mfu_label(tot).removeprefix("MFU ").strip("()"))),
        _card("bound", esc(tot["bound"]),
              esc(f"host {seconds(tot['host_s'])}, device busy {seconds(tot['device_busy_s'])}")),
        _track_card(run.prediction),
        _card("memory fit", esc(fit), fit_more, fit_cls),
        _card("kernels", esc(f"{tot['kernels']:,}"),
              esc(f"cost formulas for {cov['op_share']:.1%} of ops, {cov['byte_share']:.1%} of bytes")),
    ]
    return f'<div class="cards">{"".join(cards)}</div>'


def _track_card(p: Prediction) -> str:
    """nnperf's median error on measured runs like this one, and which runs: how far to
    trust the step time beside it."""
    record = p.track_record
    if not record.found:
        return _card("runs like this one", "none measured",
                     esc(f"{record.description}: nnperf has not been checked on anything like this workload"), "bad")
    bias = f"median {record.median_signed_error:+.0%} (negative: predicted faster than measured)"
    return _card("runs like this one", esc(f"median error {record.median_abs_error:.0%}"),
                 esc(f"n={record.n}: {record.description}; {bias}"))


def _samples_line(tot: dict[str, Any]) -> str:
    """Samples/s under a token throughput; nothing under a sample throughput (it would repeat
    the card's own figure)."""
    if tot["throughput_unit"] == "samples/s":
        return ""
    return esc(rate(tot["samples_per_s"], "samples/s"))


def _legend() -> str:
    items = "".join(f'<span><i style="background:{c}"></i>{esc(b)}-bound</span>' for b, c in BOUND_COLORS.items()
                    if b != "none")
    return (f'<div class="legend">{items}<span>&#9671; measured</span>'
            "<span>solid: matrix-unit roof, dashed: CUDA-core roof, dotted: ridge point</span></div>")


def roofline_section(run: Run, index: int) -> str:
    r = run.roofs
    what = f"one point per layer (modules cut at depth {run.depth})" if run.by == "layer" else "one point per aten op"
    hidden = [p for p in run.points if not p.plottable]
    note = ""
    if hidden:
        names = ", ".join(esc(p.label) for p in hidden[:12]) + (" ..." if len(hidden) > 12 else "")
        note = (f'<p class="sub">Not on the chart (no FLOPs, pure data movement): '
                f"{len(hidden)} group(s): {names}</p>")
    return (
        f'<p class="sub">{esc(r.gpu)}: {esc(what)}; roofs for {esc(r.dtype)} '
        f"(peak {esc(si(r.peak_flops, 'FLOP/s'))} on {esc(r.peak_unit)} cores, "
        f"bandwidth {esc(si(r.bandwidth, 'B/s'))}, ridge {r.ridge:.3g} FLOP/B)</p>"
        + roofline_svg(run.points, r, chart_id=f"roofline-{index}", run=index, measured=run.measured_times())
        + _legend() + note
    )


def _bar(value: float, top: float, cls: str = "") -> str:
    width = 0.0 if not top else max(0.0, min(1.0, value / top)) * 160
    return f'<span class="bar {cls}" style="width:{width:.1f}px"></span>'


def layers_section(runs: list[Run]) -> str:
    """Per-layer predicted (and measured) time and memory bars; one time column per GPU."""
    first = runs[0]
    mem, mem_what = first.layer_memory, first.layer_memory_what
    keys = [p.key for p in first.layers]
    labels = {p.key: (p.label, p.type) for p in first.layers}
    times = [{p.key: p for p in run.layers} for run in runs]
    measured = [run.measured_times() for run in runs]
    top_t = max([p.time_s for t in times for p in t.values()]
                + [v for m in measured for v in m.values()] + [0.0])
    top_m = max([*mem.values(), 0.0])
    head = ['<th class="l">Layer</th>', '<th class="l">Type</th>']
    for run in runs:
        g = esc(run.gpu_name) if len(runs) > 1 else ""
        head.append(f'<th class="l">Predicted time {g}</th>')
        if any(measured):
            head.append(f'<th class="l">Measured time {g}</th>')
        head.append(f'<th class="l">Bound {g}</th>')
    head.append(f'<th class="l">Memory ({esc(mem_what)})</th>')
    rows = []
    for key in keys:
        label, kind = labels[key]
        cells = [f'<td class="l name" title="{esc(label)}">{esc(label)}</td>', f'<td class="l">{esc(kind)}</td>']
        for t, m, run in zip(times, measured, runs, strict=True):
            p = t.get(key)
            tv = p.time_s if p else 0.0
            share = tv / run.prediction.step.step_s if run.prediction.step.step_s else 0.0
            cells.append(f'<td class="barcell" data-v="{tv!r}"><span class="t">{esc(seconds(tv))}</span>'
                         f"{_bar(tv, top_t)} {share:.1%}</td>")
            if any(measured):
                mv = m.get(key)
                cells.append(f'<td class="barcell" data-v="{mv or 0!r}"><span class="t">'
                             f"{esc(seconds(mv)) if mv else '-'}</span>{_bar(mv or 0, top_t, 'meas')}</td>")
            cells.append(f'<td class="l">{esc(p.bound if p else "-")}</td>')
        mv = mem.get(key, 0.0)
        cells.append(f'<td class="barcell" data-v="{mv!r}"><span class="t">{esc(binary(mv))}</span>'
                     f"{_bar(mv, top_m, 'mem')}</td>")
        rows.append(f"<tr>{''.join(cells)}</tr>")
    measured_note = "" if any(measured) else '<p class="na">Measured times: not available (pass --measured run.json).</p>'
    return (f"{measured_note}<div class=\"scroll\"><table class=\"sortable layers\"><thead><tr>{''.join(head)}</tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table></div>")


def memory_section(runs: list[Run]) -> str:
    run = runs[0]
    mem = run.memory
    if mem is None:
        return f'<p class="na">Memory timeline: not available ({esc(run.memory_note)}).</p>'
    timeline = [(p.index, p.phase, float(p.allocated)) for p in mem.timeline]
    measured = run.measured.memory_timeline if run.measured else []
    smallest = min(capacity(r.prediction.gpu) for r in runs)
    facts = [f"predicted peak allocated {binary(mem.peak_allocated or 0)}",
             f"reserved {binary(mem.peak_reserved or 0)}",
             f"device total {binary(mem.device_total or 0)}"]
    if mem.peak_phase:
        facts.append(f"peak in {mem.peak_phase} at {_module(run.prediction, mem.peak_module or '')}")
    if run.measured and run.measured.peak_allocated:
        facts.append(f"measured peak allocated {binary(run.measured.peak_allocated)}")
    breakdown = "".join(
        f"<tr><td class=\"l\">{esc(category_label(k))}</td><td data-v=\"{v}\">{esc(binary(v))}</td></tr>"
        for k, v in sorted(mem.breakdown.items(), key=lambda kv: -kv[1]) if v
    )
    return (f'<p class="sub">{esc("; ".join(facts))}. Orange line: measured (when given).</p>'
            + memory_svg(timeline, capacity=smallest, measured=measured, events=mem.timeline_events or None)
            + '<div class="legend"><span><i style="background:#4c78a8"></i>forward</span>'
              '<span><i style="background:#e45756"></i>backward</span>'
              '<span><i style="background:#54a24b"></i>optimizer</span></div>'
            + ("<h3>At the peak</h3><table class=\"sortable\"><thead><tr><th class=\"l\">What</th><th>Bytes</th>"
               f"</tr></thead><tbody>{breakdown}</tbody></table>" if breakdown else ""))


def _module(prediction: Prediction, module: str) -> str:
    """An op's module path as the tables show it: the root's own ops as '(GPT2) own ops'."""
    return module_label(module or ROOT_OWN_OPS, prediction.analysis.root_type)


def gemm_section(run: Run) -> str:
    rows = run.gemms
    if not rows:
        return '<p class="sub">No GEMMs in this step.</p>'
    cols = ["Modules", "Phase", "Role", "M", "N", "K", "Batch", "dtype", "Count", "Total time", "Each",
            "Tile", "CTAs", "Waves", "Tile eff.", "Wave eff.", "Aligned", "Bound", "% of peak"]
    left = {"Modules", "Phase", "Role", "dtype", "Tile", "Aligned", "Bound"}
    head = "".join(f'<th class="{"l" if c in left else ""}">{esc(c)}</th>' for c in cols)
    body = []
    for r in rows:
        g, e = r.gemm, r.estimate
        mods = ", ".join(_module(run.prediction, m) for m in r.modules) + (" ..." if r.count > len(r.modules) else "")
        align = '<span class="ok">yes</span>' if e.aligned else f'<span class="warn" title="{esc(e.alignment_note)}">no: {esc(e.alignment_note)}</span>'
        frac = e.achieved_flops / e.peak_flops if e.peak_flops else 0.0
        body.append(
            "<tr>"
            f'<td class="l name" title="{esc(mods)}">{esc(mods)}</td><td class="l">{esc(g.phase)}</td>'
            f'<td class="l">{esc(g.role)}</td><td data-v="{g.m}">{g.m:,}</td><td data-v="{g.n}">{g.n:,}</td>'
            f'<td data-v="{g.k}">{g.k:,}</td><td data-v="{g.batch}">{g.batch:,}</td><td class="l">{esc(g.dtype)}</td>'
            f'<td data-v="{r.count}">{r.count}</td><td data-v="{r.time_s!r}">{esc(seconds(r.time_s))}</td>'
            f'<td data-v="{e.time_s!r}">{esc(seconds(e.time_s))}</td>'
            f'<td class="l">{tile_text(e.tile)}{f" split-K {e.split_k}" if e.split_k > 1 else ""}</td>'
            f'<td data-v="{e.ctas}">{e.ctas:,}</td><td data-v="{e.waves}">{e.waves:,}</td>'
            f'<td data-v="{e.tile_efficiency!r}">{e.tile_efficiency:.0%}</td>'
            f'<td data-v="{e.wave_efficiency!r}">{e.wave_efficiency:.0%}</td>'
            f'<td class="l">{align}</td><td class="l">{esc(e.bound)}</td><td data-v="{frac!r}">{frac:.0%}</td>'
            "</tr>"
        )
    total = sum(r.count for r in rows)
    return (f'<p class="sub">{total} GEMMs in {len(rows)} distinct shapes, slowest first; '
            "tile/wave efficiency and alignment from the GEMM model.</p>"
            f'<div class="scroll"><table class="sortable gemms"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table></div>")


def uncovered_section(run: Run) -> str:
    cov = run.prediction.analysis.coverage
    if not cov["uncovered"]:
        return f'<p class="ok">Every op has a cost formula ({cov["ops"]:,} ops).</p>'
    rows = "".join(
        f'<tr><td class="l name">{esc(u["op"])}</td><td data-v="{u["count"]}">{u["count"]:,}</td>'
        f'<td data-v="{u["bytes"]!r}">{esc(binary(u["bytes"]))}</td></tr>'
        for u in cov["uncovered"]
    )
    return (f'<p class="sub">{cov["ops"] - cov["modeled"]:,} of {cov["ops"]:,} ops have no cost formula; '
            "they are timed from the bytes they touch.</p>"
            '<table class="sortable uncovered"><thead><tr><th class="l">Op</th><th>Count</th>'
            f"<th>Bytes touched</th></tr></thead><tbody>{rows}</tbody></table>")


def compare_section(runs: list[Run]) -> str:
    cols = ["GPU", "Step time", "Runs like it", "Measured", "Throughput", "MFU", "Bound", "Memory fit", "USD/h"]
    head = "".join(f'<th class="{"l" if c in ("GPU", "Bound", "Memory fit") else ""}">{c}</th>' for c in cols)
    body = []
    for run in runs:
        tot = run.totals
        fit, _, cls = memory_fit(run)
        m = run.measured.step_time_s if run.measured else None
        price = run.prediction.gpu.price_usd_per_hour
        track = run.prediction.track_record
        body.append(
            f'<tr><td class="l">{esc(run.gpu_name)}</td><td data-v="{tot["step_time_s"]!r}">{esc(seconds(tot["step_time_s"]))}</td>'
            f'<td title="{esc(track.text())}">{esc(track.cell())}</td>'
            f"<td>{esc(seconds(m)) if m else '-'}</td>"
            f'<td data-v="{tot["throughput"]!r}">{esc(rate(tot["throughput"], tot["throughput_unit"]))}</td>'
            f'<td data-v="{tot["mfu"]!r}">{tot["mfu"]:.1%}</td><td class="l">{esc(tot["bound"])}</td>'
            f'<td class="l {cls}">{esc(fit)}</td><td>{f"{price:.2f}" if price else "-"}</td></tr>'
        )
    return f'<table class="sortable compare"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


