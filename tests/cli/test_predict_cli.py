"""`nnperf predict` and `nnperf compare` through the CLI: output, JSON and bad input."""

from __future__ import annotations

import json

from click.testing import CliRunner

from nnperf.cli.app import cli


def run(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_predict_prints_modules_and_step():
    r = run("predict", "mlp", "--batch", "8", "--gpu", "h100")
    assert r.exit_code == 0, r.output
    assert "step time" in r.output
    assert "(optimizer)" in r.output and "Linear" not in r.output  # module names, not types


def test_predict_json_has_timing_fields():
    r = run("predict", "mnist-cnn", "--batch", "64", "--gpu", "a100", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["totals"]["bound"] == "host"
    assert doc["gpu"]["sm_count"] == 108


def test_unknown_gpu_lists_close_names():
    r = run("predict", "mlp", "--gpu", "h10")
    assert r.exit_code == 2
    assert "h100" in r.output.lower() and "Traceback" not in r.output


def test_bf16_on_v100_is_a_clear_error():
    r = run("predict", "mlp", "--gpu", "v100", "--dtype", "bf16")
    assert r.exit_code == 2
    assert "bf16" in r.output and "Traceback" not in r.output


def test_compare_puts_gpus_side_by_side(tmp_path):
    prices = tmp_path / "prices.toml"
    prices.write_text("h100 = 10.0\n")
    r = run("compare", "mlp", "--batch", "256", "--gpus", "a100,h100", "--prices", str(prices), "--json")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)["gpus"]
    assert [row["id"] for row in rows] == ["a100-80gb-sxm", "h100-sxm"]
    h100 = rows[1]
    assert h100["usd_per_hour"] == 10.0
    per_million = 10.0 / 3600 * 1e6 / (256 / h100["step_time_s"])
    assert abs(h100["usd_per_million_samples"] - per_million) < 1e-9 * per_million


def test_compare_rejects_bad_gpu_before_tracing():
    r = run("compare", "mlp", "--gpus", "a100,nosuchgpu")
    assert r.exit_code == 2 and "nosuchgpu" in r.output
