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
from importlib import resources
from typing import Any

from nnperf.prediction import Prediction
from nnperf.report.html.measured import Measured
from nnperf.report.html.sections_html import (
    compare_section,
    gemm_section,
    layers_section,
    memory_section,
    roofline_section,
    summary_section,
    uncovered_section,
)
from nnperf.report.html.svg import esc
from nnperf.report.sections import AUTO, make_runs, memory_for

__all__ = ["AUTO", "build_compare_report", "build_report", "memory_for"]


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


def build_report(
    prediction: Prediction,
    *,
    memory: Any = AUTO,
    measured: Measured | None = None,
    depth: int = 2,
    by: str = "layer",
    title: str | None = None,
    advice: Any = None,
) -> str:
    """The report page for one GPU (a complete HTML document as a string); ``advice`` (an
    ``nnperf.advise`` result for the same workload) adds its section."""
    run = make_runs([prediction], memory, measured, depth, by)[0]
    sections = [
        ("summary", "Summary", summary_section(run)),
        ("roofline", "Roofline", roofline_section(run, 0)),
        ("layers", "Per-layer time and memory", layers_section([run])),
        ("memory", "Memory timeline", memory_section([run])),
        ("gemms", "GEMMs", gemm_section(run)),
        ("uncovered", "Ops without a cost formula", uncovered_section(run)),
    ]
    data = {"schema": "nnperf.report/1", "model": prediction.analysis.model, "runs": [run.to_json()]}
    if advice is not None:
        from nnperf.report.html.advice_html import advice_section

        sections.insert(1, ("advice", "Advice: what to change", advice_section(advice)))
        data["advice"] = advice.to_json()
    title = title or f"{prediction.analysis.label} on {prediction.gpu.name}"
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
    runs = make_runs(predictions, memory, measured, depth, by)
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
    title = title or f"{predictions[0].analysis.label} on {', '.join(r.gpu_name for r in runs)}"
    return _page(title, sections, data, _config_line(predictions[0]))
