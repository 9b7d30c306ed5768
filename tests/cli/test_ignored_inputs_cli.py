"""Inputs that would be dropped without a word are errors naming them: -O and --seq for a
factory that cannot take them, a --batch the input shape contradicts, --csv with --json, and
analyze keywords given to predict() with an Analysis."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
from click.testing import CliRunner
from torch import nn

import nnperf
from nnperf.cli.app import cli
from nnperf.errors import UsageError

FACTORIES = textwrap.dedent('''
    import torch
    from torch import nn


    def factory():
        return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 4))


    def with_inputs():
        return nn.Linear(64, 4), (torch.randn(8, 64),)


    def sized(batch=2, seq_len=16):
        model = nn.Sequential(nn.Embedding(100, 8), nn.Linear(8, 4))
        return model, (torch.randint(0, 100, (batch, seq_len)),)


    def sized_seq(seq=5):
        return nn.Embedding(100, 8), (torch.randint(0, 100, (2, seq)),)
''')


@pytest.fixture()
def models(tmp_path):
    path = tmp_path / "mymodel.py"
    path.write_text(FACTORIES)
    return path


def run(*args: str):
    result = CliRunner().invoke(cli, ["analyze", *args])
    return result, result.output


def _usage_error(result, out: str) -> str:
    assert result.exit_code == 2, out
    assert "Traceback" not in out
    return out


def test_model_options_on_a_factory(models):
    out = _usage_error(*run(f"{models}:factory", "-O", "foo=1", "--input-shape", "8,64"))
    assert "-O foo=1" in out and "built-in models only" in out


def test_seq_on_a_factory_without_a_seq_parameter(models):
    out = _usage_error(*run(f"{models}:factory", "--seq", "16", "--input-shape", "8,64"))
    assert "--seq 16" in out and "seq_len" in out


@pytest.mark.parametrize(("target", "args", "shape"), [
    ("sized", ["--seq", "32", "--batch", "3"], [3, 32]),
    ("sized_seq", ["--seq", "7"], [2, 7]),
])
def test_seq_reaches_a_factory_that_takes_it(models, target, args, shape):
    result, out = run(f"{models}:{target}", *args, "--json", "--inference")
    assert result.exit_code == 0, out
    assert json.loads(result.stdout)["config"]["inputs"][0]["shape"] == shape


@pytest.mark.parametrize(("args", "names"), [
    (["--input-shape", "8,64", "--batch", "4"], ["--batch 4", "--input-shape 8,64"]),
    (["--tokens", "8,64", "--vocab", "50", "--batch", "4"], ["--batch 4", "--tokens 8,64"]),
])
def test_batch_contradicting_the_input_spec(models, args, names):
    out = _usage_error(*run(f"{models}:factory", *args))
    assert all(name in out for name in names)


def test_batch_contradicting_the_inputs_a_factory_returns(models):
    out = _usage_error(*run(f"{models}:with_inputs", "--batch", "4"))
    assert "--batch 4" in out and "batch 8" in out and "no batch parameter" in out
    result, out = run(f"{models}:with_inputs", "--batch", "8", "--inference")  # agrees: fine
    assert result.exit_code == 0, out


def test_batch_agreeing_with_the_input_shape_is_fine(models):
    result, out = run(f"{models}:factory", "--input-shape", "8,64", "--batch", "8", "--inference")
    assert result.exit_code == 0, out


def test_csv_and_json_together():
    out = _usage_error(*run("mlp", "--csv", "--json"))
    assert "--json" in out and "--csv" in out and "choose one" in out


def test_python_api_refuses_ignored_keywords():
    model = nn.Linear(64, 4)
    with pytest.raises(UsageError, match="batch=4 contradicts"):
        nnperf.analyze(model, inputs=torch.randn(8, 64), batch=4)
    with pytest.raises(UsageError, match="n_layer=2"):
        nnperf.analyze(model, inputs=torch.randn(8, 64), n_layer=2)
    with pytest.raises(UsageError, match="--seq 16"):
        nnperf.analyze(model, inputs=torch.randn(8, 64), seq_len=16)
    analysis = nnperf.analyze(model, inputs=torch.randn(8, 64), train=False)
    with pytest.raises(UsageError, match="amp, batch"):
        nnperf.predict(analysis, "h100", batch=4, amp="bf16")
    assert nnperf.predict(analysis, "h100").totals["step_time_s"] > 0
