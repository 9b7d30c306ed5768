"""``nnperf gpus``: the catalog table, one entry in full, JSON, and errors."""

from __future__ import annotations

import json

from click.testing import CliRunner

from nnperf.cli.app import cli


def run(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_catalog_table():
    result = run("gpus")
    assert result.exit_code == 0, result.output
    for text in ("h100-sxm", "989.4", "mi300x", "TF32", "$/h"):
        assert text in result.output


def test_one_gpu_in_full_with_sources():
    result = run("gpus", "NVIDIA H100 80GB HBM3")
    assert result.exit_code == 0, result.output
    assert "1830 MHz" in result.output and "source: datasheet" in result.output


def test_json():
    one = json.loads(run("gpus", "a100", "--json").output)
    assert one["id"] == "a100-80gb-sxm" and one["sm_count"] == 108
    assert one["tensor_tflops"]["tf32"] == 156 and one["sources"]
    catalog = json.loads(run("gpus", "--json").output)
    assert len(catalog) >= 20


def test_unknown_gpu_is_a_usage_error():
    result = run("gpus", "h1000")
    assert result.exit_code == 2
    assert "unknown GPU 'h1000'" in result.output


def test_footer_explains_the_marker_only_when_a_row_carries_it():
    from dataclasses import replace

    from nnperf.cli.gpus import _footer
    from nnperf.hardware import list_gpus, load_gpu

    out = run("gpus").output
    marked = any(g.confidence != "datasheet" for g in list_gpus())
    assert ("(?)" in out) == marked
    h100 = load_gpu("h100")
    assert "(?)" not in _footer([h100]) and "nnperf gpus NAME" in _footer([h100])
    assert "(?) = values not all re-checked" in _footer([h100, replace(h100, confidence="unverified")])
