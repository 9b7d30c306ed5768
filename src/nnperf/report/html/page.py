"""The self-contained HTML report: one file, scripts and styles inlined, nothing fetched.

Layout of a report (one GPU) or a comparison (several GPUs side by side): summary, roofline,
per-layer time and memory bars, memory timeline, GEMM table, uncovered ops. Sections whose
source is missing (no memory model, no measurement) say "not available" instead of vanishing,
so a reader knows what was not checked.

Safety: module and class names come from user code and can be any string. Every one of them
is written through ``esc`` (HTML text and attributes) or into the JSON data island, where
``<``, ``>`` and ``&`` are escaped as ``\\u003c``-style sequences so no string can close the
``<script>`` element. The script only ever sets ``textContent``.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from nnperf.kernels.gemm import tile_text
from nnperf.passes.memory import MemoryReport
from nnperf.passes.memory.capacity import MemoryFit, capacity
from nnperf.passes.memory.report import category_label
from nnperf.passes.rollup import ROOT_OWN_OPS
from nnperf.prediction import Prediction
from nnperf.report.html.measured import Measured
from nnperf.report.html.svg import esc, memory_svg, roofline_svg
from nnperf.report.labels import module_label
from nnperf.report.prediction_tables import mfu_label
from nnperf.report.roofline import BOUND_COLORS, RooflinePoint, cut, roofline_points, roofs
from nnperf.report.units import binary, rate, seconds, si

#: Pass as ``memory`` to have the report run the memory model itself (when it is installed).
AUTO = "auto"


def asset(name: str) -> str:
    """The text of a packaged asset (CSS/JS), inlined into every page."""
    return resources.files("nnperf.report.html").joinpath("assets", name).read_text(encoding="utf-8")


def json_island(doc: Any) -> str:
    """JSON safe inside ``<script type="application/json">``: no '<', '>' or '&' survive."""
    text = json.dumps(doc, separators=(",", ":"), allow_nan=False, default=str)
    return (
        text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
        .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    )


def memory_for(prediction: Prediction) -> tuple[Any | None, str]:
    """The prediction's memory report (computed once, shared with its totals and the fit
    verdict): (MemoryReport or None, why not)."""
    try:
        return prediction.memory, ""
    except Exception as err:  # a report should still come out if one pass fails
        return None, f"the memory model failed: {type(err).__name__}: {err}"


@dataclass
class Run:
    """One GPU's prediction with everything the page shows about it."""

    prediction: Prediction
    depth: int
    by: str
    memory: Any | None = None  # nnperf.passes.memory.MemoryReport
    memory_note: str = ""
    measured: Measured | None = None
    points: list[RooflinePoint] = field(init=False)
    layers: list[RooflinePoint] = field(init=False)

    def __post_init__(self) -> None:
        self.points = roofline_points(self.prediction, by=self.by, depth=self.depth)
        self.layers = (
            self.points if self.by == "layer" else roofline_points(self.prediction, by="layer", depth=self.depth)
        )

    @property
    def gpu_name(self) -> str:
        return self.prediction.gpu.name

    def measured_times(self) -> dict[str, float]:
        return dict(self.measured.module_time_s) if self.measured else {}

    def peak_memory(self) -> float | None:
        if self.memory is None:
            return None
        return self.memory.device_total or self.memory.peak_reserved or self.memory.peak_allocated

    def to_json(self) -> dict[str, Any]:
        measured = self.measured_times()
        return {
            "gpu": self.gpu_name,
            "roofs": roofs(self.prediction).to_json(),
            "points": [{**p.to_json(), "measured_s": measured.get(p.key)} for p in self.points],
            "totals": self.prediction.totals,
        }


# ---- sections --------------------------------------------------------------------------------

def _card(key: str, value: str, more: str = "", cls: str = "") -> str:
    extra = f'<div class="m">{more}</div>' if more else ""
    return f'<div class="card {cls}"><div class="k">{esc(key)}</div><div class="v">{value}</div>{extra}</div>'


def memory_fit(run: Run) -> tuple[str, str, str]:
    """(verdict, detail, css class) for the summary: predicted device memory vs capacity."""
    peak = run.peak_memory()
    if peak is None:
        return "not available", esc(run.memory_note or "no memory prediction"), "na"
    fit = MemoryFit.on(peak, run.prediction.gpu)
    return (
        f"{'fits' if fit.fits else 'does not fit'} ({fit.share:.0%})",
        f"{esc(binary(peak))} of {esc(binary(fit.capacity))}",
        "ok" if fit.fits else "bad",
    )


def summary_section(run: Run) -> str:
    tot = run.prediction.totals
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
        _card("memory fit", esc(fit), fit_more, fit_cls),
        _card("kernels", esc(f"{tot['kernels']:,}"),
              esc(f"cost formulas for {cov['op_share']:.1%} of ops, {cov['byte_share']:.1%} of bytes")),
    ]
    return f'<div class="cards">{"".join(cards)}</div>'


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
    r = roofs(run.prediction)
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


def layer_memory(run: Run) -> tuple[dict[str, float], str]:
    """Bytes per layer group: weights plus activations kept for backward (or layer outputs)."""
    trace = run.prediction.analysis.trace
    out: dict[str, float] = defaultdict(float)
    for sid, pname in trace.param_storages.items():
        owner = pname.rsplit(".", 1)[0] if "." in pname else ""
        out[cut(owner, run.depth)] += trace.storages[sid].nbytes
    if run.memory is not None and run.memory.saved_activations:
        for module, nbytes in run.memory.saved_activations.items():
            out[cut(module, run.depth)] += nbytes
        return out, "weights + activations kept for backward"
    for module, nbytes in trace.module_output_bytes.items():
        if module and cut(module, run.depth) == module:  # a group's own output, not its children's
            out[module] += nbytes
    return out, "weights + layer outputs (memory model not available)"


def layers_section(runs: list[Run]) -> str:
    """Per-layer predicted (and measured) time and memory bars; one time column per GPU."""
    first = runs[0]
    mem, mem_what = layer_memory(first)
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


def gemm_rows(prediction: Prediction) -> list[dict[str, Any]]:
    """GEMMs grouped by shape, phase and role (a 48-layer model repeats each shape 48 times)."""
    groups: dict[tuple, dict[str, Any]] = {}
    for t in prediction.step.ops:
        for gt in t.gemms:
            g, est = gt.gemm, gt.estimate
            key = g.shape_key
            row = groups.get(key)
            if row is None:
                row = groups[key] = {"gemm": g, "est": est, "count": 0, "time_s": 0.0, "modules": []}
            row["count"] += 1
            row["time_s"] += est.time_s
            if len(row["modules"]) < 3 and g.module not in row["modules"]:
                row["modules"].append(g.module)
    return sorted(groups.values(), key=lambda r: -r["time_s"])


def gemm_section(run: Run) -> str:
    rows = gemm_rows(run.prediction)
    if not rows:
        return '<p class="sub">No GEMMs in this step.</p>'
    cols = ["Modules", "Phase", "Role", "M", "N", "K", "Batch", "dtype", "Count", "Total time", "Each",
            "Tile", "CTAs", "Waves", "Tile eff.", "Wave eff.", "Aligned", "Bound", "% of peak"]
    left = {"Modules", "Phase", "Role", "dtype", "Tile", "Aligned", "Bound"}
    head = "".join(f'<th class="{"l" if c in left else ""}">{esc(c)}</th>' for c in cols)
    body = []
    for r in rows:
        g, e = r["gemm"], r["est"]
        mods = ", ".join(_module(run.prediction, m) for m in r["modules"]) + (" ..." if r["count"] > len(r["modules"]) else "")
        align = '<span class="ok">yes</span>' if e.aligned else f'<span class="warn" title="{esc(e.alignment_note)}">no: {esc(e.alignment_note)}</span>'
        frac = e.achieved_flops / e.peak_flops if e.peak_flops else 0.0
        body.append(
            "<tr>"
            f'<td class="l name" title="{esc(mods)}">{esc(mods)}</td><td class="l">{esc(g.phase)}</td>'
            f'<td class="l">{esc(g.role)}</td><td data-v="{g.m}">{g.m:,}</td><td data-v="{g.n}">{g.n:,}</td>'
            f'<td data-v="{g.k}">{g.k:,}</td><td data-v="{g.batch}">{g.batch:,}</td><td class="l">{esc(g.dtype)}</td>'
            f'<td data-v="{r["count"]}">{r["count"]}</td><td data-v="{r["time_s"]!r}">{esc(seconds(r["time_s"]))}</td>'
            f'<td data-v="{e.time_s!r}">{esc(seconds(e.time_s))}</td>'
            f'<td class="l">{tile_text(e.tile)}{f" split-K {e.split_k}" if e.split_k > 1 else ""}</td>'
            f'<td data-v="{e.ctas}">{e.ctas:,}</td><td data-v="{e.waves}">{e.waves:,}</td>'
            f'<td data-v="{e.tile_efficiency!r}">{e.tile_efficiency:.0%}</td>'
            f'<td data-v="{e.wave_efficiency!r}">{e.wave_efficiency:.0%}</td>'
            f'<td class="l">{align}</td><td class="l">{esc(e.bound)}</td><td data-v="{frac!r}">{frac:.0%}</td>'
            "</tr>"
        )
    total = sum(r["count"] for r in rows)
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
    cols = ["GPU", "Step time", "Measured", "Throughput", "MFU", "Bound", "Memory fit", "USD/h"]
    head = "".join(f'<th class="{"l" if c in ("GPU", "Bound", "Memory fit") else ""}">{c}</th>' for c in cols)
    body = []
    for run in runs:
        tot = run.prediction.totals
        fit, _, cls = memory_fit(run)
        m = run.measured.step_time_s if run.measured else None
        price = run.prediction.gpu.price_usd_per_hour
        body.append(
            f'<tr><td class="l">{esc(run.gpu_name)}</td><td data-v="{tot["step_time_s"]!r}">{esc(seconds(tot["step_time_s"]))}</td>'
            f"<td>{esc(seconds(m)) if m else '-'}</td>"
            f'<td data-v="{tot["throughput"]!r}">{esc(rate(tot["throughput"], tot["throughput_unit"]))}</td>'
            f'<td data-v="{tot["mfu"]!r}">{tot["mfu"]:.1%}</td><td class="l">{esc(tot["bound"])}</td>'
            f'<td class="l {cls}">{esc(fit)}</td><td>{f"{price:.2f}" if price else "-"}</td></tr>'
        )
    return f'<table class="sortable compare"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


# ---- page ------------------------------------------------------------------------------------

def _config_line(prediction: Prediction) -> str:
    c = prediction.analysis.config
    parts = [c["mode"], f"batch {c['batch']}"]
    if c.get("tokens"):
        parts.append(f"{c['tokens']:,} tokens")
    parts.append(f"dtype {c['dtype']}")
    if c.get("amp"):
        parts.append(f"amp {c['amp']}")
    if c.get("optimizer"):
        parts.append(f"optimizer {c['optimizer']} ({c['optimizer_impl']})")
    params = prediction.analysis.totals["params"]
    parts.append(f"{params:,} parameters")
    return ", ".join(parts)


def _page(title: str, sections: list[tuple[str, str, str]], data: dict[str, Any], subtitle: str) -> str:
    from nnperf import __version__

    body = "".join(f'<section id="{sid}"><h2>{esc(h)}</h2>{content}</section>' for sid, h, content in sections)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        # Belt and braces for "opens offline": the page itself may not fetch anything.
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">"
        f"<title>{esc(title)}</title><style>{asset('report.css')}</style></head>"
        f'<body><div class="nnperf"><h1>{esc(title)}</h1><p class="sub">{esc(subtitle)}</p>{body}'
        f"<footer>nnperf {esc(__version__)}, generated {esc(time.strftime('%Y-%m-%d %H:%M'))}. "
        "Times are predictions unless marked measured. FLOP = 2 x MAC. Rates in decimal units "
        "(GB/s, TFLOP/s), memory sizes in binary units (MiB, GiB).</footer></div>"
        f'<script type="application/json" id="nnperf-data">{json_island(data)}</script>'
        f"<script>{asset('report.js')}</script></body></html>\n"
    )


def _runs(predictions: list[Prediction], memory: Any, measured: Measured | None, depth: int, by: str) -> list[Run]:
    runs = []
    for p in predictions:
        if memory == AUTO:
            mem, note = memory_for(p)
        else:
            mem, note = memory, ("" if memory is not None else "no memory prediction was given")
            if isinstance(mem, MemoryReport) and p.memory_report is None:
                p.memory_report = mem  # the totals' fit verdict then uses it, not a second replay
        # a measurement belongs to one GPU; overlay it only where it matches (or says nothing)
        m = measured if measured and (len(predictions) == 1 or _same_gpu(measured.gpu, p)) else None
        runs.append(Run(p, depth=depth, by=by, memory=mem, memory_note=note, measured=m))
    return runs


def _same_gpu(name: str | None, prediction: Prediction) -> bool:
    """Whether a measurement's device name (e.g. 'NVIDIA H100 80GB HBM3') is this GPU."""
    if name is None or name in (prediction.gpu.name, prediction.gpu.id):
        return True
    from nnperf.hardware import load_gpu

    try:
        return load_gpu(name).id == prediction.gpu.id
    except Exception:  # an unknown device name: do not guess
        return False


def build_report(
    prediction: Prediction,
    *,
    memory: Any = AUTO,
    measured: Measured | None = None,
    depth: int = 2,
    by: str = "layer",
    title: str | None = None,
) -> str:
    """The report page for one GPU (a complete HTML document as a string)."""
    run = _runs([prediction], memory, measured, depth, by)[0]
    sections = [
        ("summary", "Summary", summary_section(run)),
        ("roofline", "Roofline", roofline_section(run, 0)),
        ("layers", "Per-layer time and memory", layers_section([run])),
        ("memory", "Memory timeline", memory_section([run])),
        ("gemms", "GEMMs", gemm_section(run)),
        ("uncovered", "Ops without a cost formula", uncovered_section(run)),
    ]
    data = {"schema": "nnperf.report/1", "model": prediction.analysis.model, "runs": [run.to_json()]}
    title = title or f"{prediction.analysis.model} on {prediction.gpu.name}"
    return _page(title, sections, data, _config_line(prediction))


def build_compare_report(
    predictions: list[Prediction],
    *,
    memory: Any = AUTO,
    measured: Measured | None = None,
    depth: int = 2,
    by: str = "layer",
    title: str | None = None,
) -> str:
    """One page with several GPUs side by side (same traced step, one prediction per GPU)."""
    runs = _runs(predictions, memory, measured, depth, by)
    charts = "".join(f'<div><h3>{esc(r.gpu_name)}</h3>{roofline_section(r, i)}</div>' for i, r in enumerate(runs))
    gemms = "".join(f"<details><summary>{esc(r.gpu_name)}</summary>{gemm_section(r)}</details>" for r in runs)
    sections = [
        ("summary", "GPUs side by side", compare_section(runs)),
        ("roofline", "Roofline per GPU", f'<div class="charts">{charts}</div>'),
        ("layers", "Per-layer time and memory", layers_section(runs)),
        ("memory", "Memory timeline", memory_section(runs)),
        ("gemms", "GEMMs per GPU", gemms),
        ("uncovered", "Ops without a cost formula", uncovered_section(runs[0])),
    ]
    data = {"schema": "nnperf.report/1", "model": predictions[0].analysis.model, "runs": [r.to_json() for r in runs]}
    title = title or f"{predictions[0].analysis.model} on {', '.join(r.gpu_name for r in runs)}"
    return _page(title, sections, data, _config_line(predictions[0]))
