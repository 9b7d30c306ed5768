"""The report's content without a browser: points partition the step, roofs match the
datasheet, the page is self-contained, names are escaped, missing sources say so."""

from __future__ import annotations

import json
import re

import pytest
import torch
from report_helpers import tiny_mlp

from nnperf.prediction import predict
from nnperf.report.html import build_compare_report, build_report, measured_from_json
from nnperf.report.html.page import json_island
from nnperf.report.roofline import roofline_points, roofs, save_roofline


def test_points_partition_the_step(mlp_prediction):
    points = roofline_points(mlp_prediction, depth=2)
    step = mlp_prediction.step
    assert sum(p.time_s for p in points) == pytest.approx(sum(t.wall_s for t in step.ops))
    assert sum(p.flops for p in points) == pytest.approx(mlp_prediction.analysis.totals["flops"])
    assert sum(p.ops for p in points) == len(step.ops)
    by_key = {p.key: p for p in points}
    # layer 2 (1024 -> 256, batch 64): forward, input gradient and weight gradient GEMMs
    assert by_key["2"].flops == pytest.approx(3 * 2 * 64 * 1024 * 256, rel=1e-3)
    assert by_key["0"].flops == pytest.approx(2 * 2 * 64 * 256 * 1024, rel=1e-3)  # first layer: no dgrad
    ops = roofline_points(mlp_prediction, by="op")
    assert sum(p.time_s for p in ops) == pytest.approx(sum(p.time_s for p in points))


def test_roofs_are_the_h100_peaks_at_its_sustained_clock(mlp_prediction):
    r = roofs(mlp_prediction)
    assert r.dtype == "bf16"
    peak = 989.4e12 * 1470 / 1830  # H100 SXM dense bf16 tensor, quoted at 1830 MHz, held at 1470
    assert r.peak_flops == pytest.approx(peak)
    assert r.bandwidth == pytest.approx(3.35e12)
    assert r.ridge == pytest.approx(peak / 3.35e12)  # ~237 FLOP/B


def test_page_is_self_contained(mlp_prediction):
    page = build_report(mlp_prediction, memory=None)
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    assert "@import" not in page and "url(" not in page
    assert page.count("<script") == 2  # the JSON data island and the inline script
    assert 'class="pt"' in page and "Content-Security-Policy" in page


def test_missing_sources_say_not_available(mlp_prediction):
    page = build_report(mlp_prediction, memory=None)
    assert "Memory timeline: not available" in page
    assert "Measured times: not available" in page
    assert "measured: not available" in page


def test_json_island_cannot_close_its_script():
    text = json_island({"name": "</script><script>alert(1)</script>", "amp": "a&b"})
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text)["name"] == "</script><script>alert(1)</script>"


def test_names_escaped_in_markup():
    model = torch.nn.Sequential()
    model.add_module("<img src=x onerror=alert(1)>", torch.nn.Linear(8, 8))
    p = predict(model, "h100", inputs=torch.randn(2, 8))
    page = build_report(p, memory=None)
    assert "<img" not in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "<img" not in p._repr_html_() and "<img" not in p.analysis._repr_html_()


def test_measured_overlay_and_compare(mlp_prediction):
    m = measured_from_json({"totals": {"step_time_s": 1e-3}, "modules": [{"name": "2", "time_s": 5e-5}],
                            "memory": {"peak_allocated": 123456789}})
    page = build_report(mlp_prediction, memory=None, measured=m)
    assert "measured 1 ms" in page
    assert 'class="measured-pt"' in page  # one diamond for layer 2
    assert page.count('class="measured-pt"') == 1
    a100 = predict(tiny_mlp(), "a100", inputs=torch.randn(64, 256), dtype="bf16")
    cmp = build_compare_report([mlp_prediction, a100], memory=None)
    assert cmp.count('<svg class="roofline"') == 2
    assert "A100" in cmp and "H100" in cmp


def test_notebook_html_has_chart_and_no_script(mlp_prediction):
    html = mlp_prediction._repr_html_()
    assert "<svg" in html and "circle" in html and "<script" not in html
    assert "<table" in mlp_prediction.analysis._repr_html_()


def test_static_roofline_png_and_svg(mlp_prediction, tmp_path):
    png = save_roofline(mlp_prediction, tmp_path / "r.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = save_roofline(mlp_prediction, tmp_path / "r.svg")
    assert "<svg" in svg.read_text()[:500]


def test_measure_json_reads_measured_not_predicted_fields():
    doc = {  # the shape of 'nnperf measure --json': predicted and measured side by side
        "totals": {"step_time_s": 0.5, "measured_step_time_s": 0.75, "measured_peak_memory_bytes": 2**30},
        "modules": [{"name": "", "time_s": 0.5, "measured_time_s": 0.75},
                    {"name": "h.0", "time_s": 0.1, "measured_time_s": 0.125}],
        "measurement": {"device_name": "NVIDIA H100 80GB HBM3"},
    }
    m = measured_from_json(doc)
    assert m.step_time_s == 0.75
    assert m.module_time_s == {"h.0": 0.125}
    assert m.peak_allocated == 2**30
    assert m.gpu == "NVIDIA H100 80GB HBM3"


@pytest.fixture(scope="module")
def mnist_prediction():
    """mnist's Net calls F.relu, max_pool2d and log_softmax in its own forward."""
    return predict("mnist-cnn", "h100", batch=2)


def test_root_label_means_the_same_as_in_predict(mnist_prediction):
    """'(Net)' is the whole step in predict; in the report too. The root's own ops are
    '(Net) own ops' in both, with the same time."""
    layers = {p.label: p for p in roofline_points(mnist_prediction, depth=1)}
    assert "(Net)" not in layers
    own = layers["(Net) own ops"]
    tallies = mnist_prediction.by_module(1)
    assert own.key == "(own ops)" and own.type == "Net"
    assert own.time_s == pytest.approx(tallies["(own ops)"].time_s)
    whole = roofline_points(mnist_prediction, depth=0)
    assert [p.label for p in whole] == ["(Net)"]
    assert whole[0].time_s == pytest.approx(tallies[""].time_s)
    page = build_report(mnist_prediction, memory=None, depth=1)
    assert "(Net) own ops" in page


def test_summary_cards_throughput_once_and_mfu_basis(mlp_prediction):
    page = build_report(mlp_prediction, memory=None)
    cards = page[page.index('<div class="cards">'):page.index("</section>")]
    assert cards.count("samples/s") == 1 and "e+0" not in cards  # not '28.7 k ... 2.87e+04 ...'
    assert "forward+backward FLOPs" in cards and "model FLOPs" not in cards


def test_memory_breakdown_uses_the_memory_commands_labels(mlp_prediction):
    page = build_report(mlp_prediction)
    section = page[page.index('id="memory"'):page.index('id="gemms"')]
    assert "optimizer state" in section and "optimizer_state" not in section
    assert "input batch" in section and ">inputs<" not in section
