"""Self-contained HTML reports (``nnperf report``) and notebook display of results.

``build_report(prediction)`` and ``build_compare_report([p1, p2])`` return one HTML document
that opens offline: styles, script and data are inlined, charts are inline SVG.
"""

from __future__ import annotations

from nnperf.report.html.measured import Measured, load_measured, measured_from_json
from nnperf.report.html.notebook import analysis_html, prediction_html
from nnperf.report.html.page import AUTO, build_compare_report, build_report, memory_for

__all__ = [
    "AUTO",
    "Measured",
    "analysis_html",
    "build_compare_report",
    "build_report",
    "load_measured",
    "measured_from_json",
    "memory_for",
    "prediction_html",
]
