"""``nnperf report`` and ``nnperf predict --trace-out`` from the command line."""

from __future__ import annotations

import json

from click.testing import CliRunner

from nnperf.cli.app import cli

MODEL = ["mlp", "--batch", "8"]


def test_report_html_png_svg(tmp_path):
    out, png, svg = tmp_path / "r.html", tmp_path / "r.png", tmp_path / "r.svg"
    res = CliRunner().invoke(cli, ["report", *MODEL, "--gpu", "h100", "-o", str(out), "--png", str(png),
                                   "--svg", str(svg)])
    assert res.exit_code == 0, res.output
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and "H100" in page and "Roofline" in page
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert svg.read_text().lstrip().startswith("<?xml")


def test_report_compare_and_measured(tmp_path):
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"totals": {"step_time_s": 0.002}}))
    out = tmp_path / "cmp.html"
    res = CliRunner().invoke(cli, ["report", *MODEL, "--gpus", "a100,h100", "--measured", str(run),
                                   "-o", str(out)])
    assert res.exit_code == 0, res.output
    page = out.read_text()
    assert page.count('<svg class="roofline"') == 2
    assert "2 ms" in page  # the measured step


def test_report_static_roofline_has_a_panel_per_gpu(tmp_path):
    svg = tmp_path / "r.svg"
    res = CliRunner().invoke(cli, ["report", *MODEL, "--gpus", "a100,h100", "--svg", str(svg)])
    assert res.exit_code == 0, res.output
    text = svg.read_text()  # matplotlib writes titles as text: one per panel
    assert "A100" in text and "H100" in text
    assert text.count('id="axes_') == 2


def test_report_errors(tmp_path):
    res = CliRunner().invoke(cli, ["report", *MODEL])
    assert res.exit_code == 2 and "nothing to write" in res.output
    res = CliRunner().invoke(cli, ["report", *MODEL, "-o", str(tmp_path / "x.html"),
                                   "--measured", str(tmp_path / "missing.json")])
    assert res.exit_code == 2 and "does not exist" in res.output
    res = CliRunner().invoke(cli, ["report", *MODEL, "--gpus", "nosuchgpu", "-o", str(tmp_path / "x.html")])
    assert res.exit_code != 0


def test_predict_trace_out(tmp_path):
    path = tmp_path / "predicted.json"
    res = CliRunner().invoke(cli, ["predict", *MODEL, "--json", "--trace-out", str(path)])
    assert res.exit_code == 0, res.output
    doc = json.loads(path.read_text())
    kinds = {e["ph"] for e in doc["traceEvents"]}
    assert {"M", "X", "s", "f"} <= kinds
