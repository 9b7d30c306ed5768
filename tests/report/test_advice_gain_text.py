"""advise's gain column: a slowdown beyond 2x reads as "11.4x slower", not "-1042.8%"; small
changes keep their share of the step; the JSON keeps the share as a number (found by a
new-user trial)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from nnperf.report.advice_tables import _gain
from nnperf.report.html.advice_html import _gpu_row
from nnperf.report.sections import share_text


@pytest.mark.parametrize(("before_s", "after_s", "text"), [
    (0.100, 0.075, "+25.0%"),  # saves a quarter of the step
    (0.100, 0.140, "-40.0%"),  # 1.4x the time: still a share
    (0.100, 0.200, "-100.0%"),  # exactly 2x: not beyond the threshold
    (0.1324, 1.513, "11.4x slower"),  # the trial's t4 row: -1042.8% before
    (0.010, 1.702, "170x slower"),  # whole factors from 100x on
    (0.001, 1.5, "1,500x slower"),
])
def test_share_text(before_s, after_s, text):
    assert share_text((before_s - after_s) / before_s) == text


def _row(before_s: float, after_s: float) -> SimpleNamespace:
    return SimpleNamespace(gain_s=before_s - after_s, gain_share=(before_s - after_s) / before_s,
                           note="", after_s=after_s, throughput_after=None, throughput_unit="samples/s",
                           memory_after=None, fits=True, usd_per_million=None, rank=3,
                           change="--gpu t4", bound="memory")


def test_terminal_and_html_rows_show_the_factor():
    assert _gain(_row(0.1324, 1.513)) == "-1.38 s (11.4x slower)"
    assert _gain(_row(0.100, 0.075)) == "+25 ms (+25.0%)"
    assert "(11.4x slower)" in _gpu_row(_row(0.1324, 1.513))
