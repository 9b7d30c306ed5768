"""The README's exit codes: 5 when a step does not fit (after printing the answer), 2 for a
bad setting of a built-in model (not 3: the model loads, the value is wrong)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from nnperf.cli.app import cli
from nnperf.errors import ModelLoadError, UsageError
from nnperf.zoo import get_model

TOO_SMALL = ["gpt2", "-O", "n_layer=1", "--gpu", "a100-40gb", "--set", "memory_gib=0.25",
             "--batch", "2"]


def test_memory_that_does_not_fit_prints_the_table_then_exits_5():
    res = CliRunner().invoke(cli, ["memory", *TOO_SMALL])
    assert res.exit_code == 5, res.output
    assert "DOES NOT FIT" in res.stdout and "peak allocated" in res.stdout  # the table
    assert "Traceback" not in res.output
    assert "at batch 2" in res.stderr and "nnperf fit" in res.stderr


def test_memory_json_that_does_not_fit_exits_5_with_the_document():
    res = CliRunner().invoke(cli, ["memory", *TOO_SMALL, "--json", "--timeline-points", "5"])
    assert res.exit_code == 5, res.output
    doc = json.loads(res.stdout)
    assert doc["memory"]["device_total_estimate"] > doc["memory"]["gpu_memory"]


def test_memory_that_fits_exits_0():
    res = CliRunner().invoke(cli, ["memory", "mlp", "--batch", "4", "--gpu", "a100-40gb"])
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize(("args", "message"), [
    (["gpt2", "-O", "n_layer=abc"], "n_layer must be an integer"),
    (["gpt2", "-O", "n_layr=2"], "unknown option 'n_layr'"),
    (["resnet18", "--seq", "16"], "takes no sequence length"),
    (["gpt2", "--seq", "2048"], "exceeds n_positions 1024 (the learned position table's length): give -O "
                                "n_positions=2048"),
    (["mlp", "-O", "widths=8,abc"], "widths must be integers"),
])
def test_bad_settings_of_a_built_in_model_exit_2(args, message):
    res = CliRunner().invoke(cli, ["analyze", *args])
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output


def test_a_bad_zoo_setting_is_a_usage_error_in_python_too():
    with pytest.raises(UsageError) as info:
        get_model("gpt2").build(1, 8, n_layer="two")
    assert info.value.exit_code == 2
    assert not isinstance(info.value, ModelLoadError)  # the model loads; the setting is wrong


def test_an_unknown_model_still_exits_3():
    res = CliRunner().invoke(cli, ["analyze", "resnet-5O"])
    assert res.exit_code == 3, res.output


@pytest.mark.parametrize(("args", "words"), [
    (["predict", "mlp", "--bogus"], "No such option '--bogus'"),
    (["predictt", "mlp"], "No such command 'predictt'"),
    (["predict"], "Missing argument 'MODEL'"),
    (["predict", "mlp", "--amp", "fp8"], "'fp8' is not one of"),
])
def test_clicks_own_usage_errors_are_one_line(args, words):
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "--help" in lines[0], result.output
    assert lines[0].startswith("nnperf: error: ")  # as nnperf's own errors begin
