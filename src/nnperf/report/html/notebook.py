"""HTML for notebook output cells (``_repr_html_`` of Analysis and Prediction).

No script: notebook front ends often do not run scripts in outputs (untrusted notebooks,
GitHub's viewer), so a fragment is plain HTML tables plus the inline SVG roofline, whose
points keep their native tooltips. Styles are scoped under ``.nnperf`` and inlined once per
output so a saved notebook still renders.
"""

from __future__ import annotations

from typing import Any

from nnperf.report.html.page import asset
from nnperf.report.html.sections_html import layers_section, roofline_section, summary_section
from nnperf.report.html.svg import esc
from nnperf.report.labels import module_label
from nnperf.report.sections import Run, memory_for
from nnperf.units import binary, si


def _wrap(title: str, body: str) -> str:
    return f'<div class="nnperf"><style>{asset("report.css")}</style><h3>{esc(title)}</h3>{body}</div>'


def prediction_html(prediction: Any, depth: int = 2) -> str:
    """Summary cards, the roofline and the per-layer table of one prediction."""
    memory, note = memory_for(prediction)  # computed once per prediction, for the fit card
    run = Run(prediction, depth=depth, by="layer", memory=memory, memory_note=note)
    body = summary_section(run) + roofline_section(run, 0) + layers_section([run])
    return _wrap(f"{prediction.analysis.model} on {prediction.gpu.name} (predicted)", body)


def analysis_html(analysis: Any, depth: int = 2) -> str:
    """Per-module counts of an analysis (no GPU yet, so no roofline): FLOPs, bytes, intensity."""
    rows = []
    root = analysis.root_type
    for row in analysis.modules(depth):
        name = module_label(row.name, root)
        t = row.tally
        indent = "&nbsp;&nbsp;" * max(row.depth - 1, 0)
        rows.append(
            f'<tr><td class="l name" title="{esc(name)}">{indent}{esc(name)}</td><td class="l">{esc(row.type)}</td>'
            f"<td>{row.params:,}</td><td>{esc(si(t.flops_forward))}</td>"
            f"<td>{esc(si(t.flops_backward))}</td><td>{esc(si(t.flops))}</td>"
            f"<td>{esc(binary(t.bytes))}</td>"
            f"<td>{t.intensity:.1f}</td></tr>"
        )
    tot, cov = analysis.totals, analysis.coverage
    head = "".join(f"<th>{c}</th>" for c in ("Params", "FLOP fwd", "FLOP bwd", "FLOP total", "Bytes moved", "FLOP/B"))
    body = (
        f'<p class="sub">{esc(analysis.trace.mode)}: {tot["params"]:,} parameters, '
        f"{esc(si(tot['flops'], 'FLOP'))} (FLOP = 2 x MAC), {esc(binary(tot['bytes']))} moved; "
        f"cost formulas for {cov['op_share']:.1%} of ops. Use nnperf.predict for time and the roofline.</p>"
        f'<div class="scroll"><table><thead><tr><th class="l">Module</th><th class="l">Type</th>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )
    return _wrap(f"{analysis.model}: per module", body)
