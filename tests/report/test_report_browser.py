"""The HTML report in a real browser (headless Chromium over DevTools): chart, hover, offline,
escaping, render time. Skipped only when chromium is absent; CI installs it."""

from __future__ import annotations

import json

import pytest
import torch
from report_helpers import ARTIFACTS, Page
from torch import nn

from nnperf.prediction import predict
from nnperf.report.html import build_report
from nnperf.report.roofline import cut

pytestmark = pytest.mark.browser


def _expected_points(prediction, depth: int = 2) -> int:
    """Layer groups with FLOPs, computed from the raw op list (not through the report code)."""
    counts = {c.index: c for c in prediction.analysis.ops}
    flops: dict[str, float] = {}
    for t in prediction.step.ops:
        key = cut(t.module, depth)
        flops[key] = flops.get(key, 0.0) + counts[t.index].flops
    return sum(1 for f in flops.values() if f > 0)


def _only_local(requests: list[str], page_url_prefix: str = "file://") -> list[str]:
    return [u for u in requests if not u.startswith(page_url_prefix)]


def test_report_renders_points_tooltip_and_stays_offline(page: Page, mlp_prediction, tmp_path):
    path = tmp_path / "report.html"
    path.write_text(build_report(mlp_prediction, memory=None))
    page.open(path)
    # one circle per layer with FLOPs: 0, 1 (GELU) and 2 are the model's layers, plus loss/optimizer
    n = page.eval("document.querySelectorAll('svg.roofline circle.pt').length")
    assert n == _expected_points(mlp_prediction)
    assert n >= 3
    labels = page.eval("Array.from(document.querySelectorAll('svg.roofline circle.pt'))"
                       ".map(c => c.getAttribute('aria-label').split(' (')[0])")
    assert {"0", "1", "2"} <= set(labels)
    # hover a point; layers 0 and 2 mirror each other (256->1024, 1024->256) and may overlap,
    # so ask the browser which circle is on top there and expect that one's tooltip
    x, y, label = page.eval("""(() => { const c = document.querySelector('svg.roofline circle.pt');
        c.scrollIntoView({block: 'center'}); const r = c.getBoundingClientRect();
        const x = r.x + r.width / 2, y = r.y + r.height / 2;
        return [x, y, document.elementFromPoint(x, y).getAttribute('aria-label').split(' (')[0]]; })()""")
    page.hover(x, y)
    page.pump(0.2)
    tip = page.eval("(() => { const t = document.getElementById('nnperf-tip');"
                    " return [getComputedStyle(t).display, t.textContent]; })()")
    assert tip[0] == "block"
    assert tip[1].startswith(label)
    for word in ("FLOPs:", "bytes:", "predicted:", "measured: not measured", "bound:"):
        assert word in tip[1]
    # FLOPs by hand (FLOP = 2 MAC, batch 64): layer 0 has no input gradient (2 GEMMs),
    # layer 2 has three; layer 1 (GELU) is no GEMM
    by_hand = {"0": 2 * (2 * 64 * 256 * 1024), "2": 3 * (2 * 64 * 1024 * 256)}
    if label in by_hand:
        assert f"FLOPs: {by_hand[label] / 1e6:.3g} MFLOP" in tip[1]
    page.screenshot(ARTIFACTS / "report-mlp.png")
    assert _only_local(page.requests) == []
    assert page.requests == [path.resolve().as_uri()]  # the document itself, nothing else
    assert page.exceptions == []


class _Evil(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.add_module("<img src=x onerror=alert(1)>", nn.Linear(8, 16))
        self.add_module("</script><script>alert(2)</script>", nn.Linear(16, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for m in self.children():
            x = m(x)
        return x


def test_module_names_with_html_are_shown_as_text_and_never_run(page: Page, tmp_path):
    evil_cls = type("<b onmouseover=alert(3)>Evil</b>", (_Evil,), {})
    p = predict(evil_cls(), "h100", inputs=torch.randn(4, 8))
    path = tmp_path / "evil.html"
    path.write_text(build_report(p, memory=None))
    page.open(path)
    page.pump(0.3)
    names = ["<img src=x onerror=alert(1)>", "</script><script>alert(2)</script>"]
    texts = page.eval("Array.from(document.querySelectorAll('td.name')).map(td => td.textContent)")
    for name in names:
        assert name in texts
    assert page.eval("document.querySelectorAll('img').length") == 0
    assert page.eval("document.querySelectorAll('b[onmouseover]').length") == 0
    # the tooltip of an evil point shows the name literally too
    box = page.eval("""(() => { const c = document.querySelector('svg.roofline circle.pt');
        c.scrollIntoView({block: 'center'}); const r = c.getBoundingClientRect();
        return [r.x + r.width / 2, r.y + r.height / 2]; })()""")
    page.hover(*box)
    page.pump(0.2)
    assert page.eval("document.querySelector('#nnperf-tip b').textContent") in [*names, "(<b onmouseover=alert(3)>Evil</b>)"]
    data = json.loads(page.eval("document.getElementById('nnperf-data').textContent"))
    assert {pt["label"] for pt in data["runs"][0]["points"]} >= set(names)
    assert page.dialogs == []
    assert _only_local(page.requests) == []
    page.screenshot(ARTIFACTS / "report-escaping.png")


@pytest.mark.slow
def test_gpt2_xl_training_report_renders_every_block(page: Page, tmp_path):
    """How long it takes is ``benchmarks/report_render.py``'s to measure (the 2 s bar): a unit
    test must not fail because the machine is busy."""
    p = predict("gpt2-xl", "h100", batch=1, seq_len=1024)
    path = tmp_path / "gpt2-xl.html"
    path.write_text(build_report(p))
    page.open(path)
    n = page.eval("document.querySelectorAll('svg.roofline circle.pt').length")
    assert n == _expected_points(p) >= 48  # the 48 transformer blocks at least
    page.screenshot(ARTIFACTS / "report-gpt2-xl.png")
