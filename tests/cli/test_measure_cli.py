"""``nnperf measure`` on the CPU: tables, JSON, Chrome trace, prediction and errors."""

from __future__ import annotations

import json

from click.testing import CliRunner

from nnperf.cli.app import cli

SMALL = ["mlp", "-b", "4", "-O", "widths=16,32,10", "--device", "cpu", "--steps", "3", "--warmup", "1"]


def run(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_cpu_without_calibration_says_no_prediction(tmp_path):
    trace = tmp_path / "t.json"
    result = run("measure", *SMALL, "--inference", "--trace-out", str(trace))
    assert result.exit_code == 0, result.output
    assert "No CPU prediction available" in result.output and "nnperf calibrate --device cpu" in result.output
    assert "measured step time" in result.output
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("name") == "aten::addmm" for e in events)


def test_json_with_an_explicit_device_description():
    result = run("measure", *SMALL, "--gpu", "h100", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    tot = doc["totals"]
    assert tot["measured_step_time_spread"]["n"] == 3
    assert tot["step_time_error"] == (tot["step_time_s"] - tot["measured_step_time_s"]) / tot["measured_step_time_s"]
    assert all("measured_time_s" in r for r in doc["modules"] + doc["ops"])
    assert doc["gpu"]["id"] == "h100-sxm" and doc["config"]["mode"] == "train"


def test_bad_devices():
    bad = run("measure", "mlp", "--device", "tpu")
    assert bad.exit_code == 2 and "unknown device" in bad.output
    import torch

    if not torch.cuda.is_available():
        missing = run("measure", "mlp", "--device", "cuda")
        assert missing.exit_code == 5 and "no CUDA GPU" in missing.output


def test_fp8_is_predicted_not_measured():
    # nnperf measures the model's own layers: an FP8 step would be a bf16 one, measured as FP8
    result = run("measure", "llama-7b", "-O", "n_layer=2", "-O", "dim=64", "-O", "n_heads=4", "-O", "ffn_hidden=128",
                 "--seq", "16", "-b", "1", "--amp", "bf16", "--fp8", "--device", "cpu")
    assert result.exit_code == 2
    assert "--fp8 is predicted, not measured" in result.output and "Traceback" not in result.output


def test_fused_pointwise_is_predicted_not_measured():
    # nnperf measures the blocks as written: a fused prediction would be compared with eager kernels
    result = run("measure", "llama-7b", "-O", "n_layer=2", "-O", "dim=64", "-O", "n_heads=4", "-O", "ffn_hidden=128",
                 "--seq", "16", "-b", "1", "--pointwise", "fused", "--device", "cpu")
    assert result.exit_code == 2
    assert "--pointwise fused is predicted, not measured" in result.output and "Traceback" not in result.output
