"""``--cudnn-benchmark``: every command that predicts or measures a step takes it, it reaches the
predicted step's TimingOptions and the measured step's torch setting, and the output says it."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from nnperf.cli.app import cli

MLP = ["mlp", "-b", "4", "-O", "widths=16,32,10"]


def run(*args: str):
    return CliRunner().invoke(cli, list(args))


@pytest.mark.parametrize("command", ["predict", "measure", "compare", "report", "advise"])
def test_every_step_command_offers_it(command):
    result = run(command, "--help")
    assert result.exit_code == 0 and "--cudnn-benchmark / --no-cudnn-benchmark" in result.output


def test_predict_json_and_text_state_the_setting():
    off = json.loads(run("predict", *MLP, "--gpu", "h100", "--json").output)
    on = json.loads(run("predict", *MLP, "--gpu", "h100", "--json", "--cudnn-benchmark").output)
    assert off["timing_options"]["cudnn_benchmark"] is False
    assert on["timing_options"]["cudnn_benchmark"] is True
    text = run("predict", *MLP, "--gpu", "h100", "--cudnn-benchmark").output
    assert "TF32 matmuls off, cudnn.benchmark on" in text


def test_compare_passes_it_to_every_gpu(predicted_timings):
    seen = predicted_timings
    result = run("compare", *MLP, "--gpus", "a100,h100", "--cudnn-benchmark", "--json")
    assert result.exit_code == 0, result.output
    assert len(seen) == 2 and all(t.cudnn_benchmark for t in seen)


def test_measure_sets_torch_for_its_run_and_predicts_with_it():
    import torch

    before = torch.backends.cudnn.benchmark
    result = run("measure", *MLP, "--device", "cpu", "--steps", "1", "--warmup", "0", "--no-ops",
                 "--gpu", "h100", "--cudnn-benchmark", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["measurement"]["cudnn_benchmark"] is True  # what torch had during the steps
    assert doc["timing_options"]["cudnn_benchmark"] is True  # what the prediction assumed
    assert torch.backends.cudnn.benchmark is before  # restored


def test_a_value_given_to_the_flag_is_refused_in_one_line():
    result = run("predict", *MLP, "--cudnn-benchmark=yes")
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "--cudnn-benchmark" in lines[0] and "Traceback" not in result.output


def test_a_layout_run_refuses_it(tmp_path):
    result = run("measure", "mlp", "--layout", str(tmp_path / "plan.json"), "--cudnn-benchmark")
    assert result.exit_code == 2
    assert "--cudnn-benchmark is not applied to a --layout run" in result.output
