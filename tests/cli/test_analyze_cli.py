"""``nnperf analyze`` through click: outputs parse, bad input is one line and an exit code."""

from __future__ import annotations

import csv
import io
import json

import pytest
from click.testing import CliRunner

from nnperf.cli.app import cli

MLP = ["mlp", "--batch", "4", "-O", "widths=8,16,4"]


def run(*args):
    result = CliRunner().invoke(cli, ["analyze", *args])
    return result, result.output + (result.stderr if hasattr(result, "stderr") else "")


def test_json_output_parses_with_the_documented_keys():
    result, _ = run(*MLP, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert {"schema", "model", "config", "totals", "modules", "ops", "gemms", "coverage"} <= set(doc)
    assert doc["model"] == "mlp"
    assert doc["totals"]["params"] == 8 * 16 + 16 + 16 * 4 + 4
    assert len(doc["gemms"]) == 3 * 2 - 1
    assert doc["config"]["batch"] == 4


def test_json_depth_zero_has_the_root_only():
    result, _ = run(*MLP, "--json", "--depth", "0")
    assert result.exit_code == 0
    assert [m["name"] for m in json.loads(result.stdout)["modules"]] == [""]


@pytest.mark.parametrize("by, column", [("module", "name"), ("op", "op"), ("gemm", "role")])
def test_csv_parses(by, column):
    result, _ = run(*MLP, "--csv", "--by", by)
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert rows and column in rows[0]
    if by == "gemm":
        assert len(rows) == 5


@pytest.mark.parametrize("by", ["module", "op", "gemm"])
def test_tables_print(by):
    result, out = run(*MLP, "--by", by, "--inference")
    assert result.exit_code == 0, out
    assert "Traceback" not in out and out.strip()


def test_unknown_model_lists_closest_names():
    result, out = run("resnet-5O")
    assert result.exit_code == 3
    assert "resnet50" in out
    assert "Traceback" not in out


@pytest.mark.parametrize(
    "make, fragment",
    [
        (lambda d: f"{d}/nope.py:model", "nope.py"),
        (lambda d: f"{d}/broken.py:model", "SyntaxError"),
        (lambda d: f"{d}/raises.py:model", "ValueError: bad config"),
    ],
)
def test_factory_problems_exit_3_naming_file_and_exception(tmp_path, make, fragment):
    (tmp_path / "broken.py").write_text("def model(:\n")
    (tmp_path / "raises.py").write_text("def model():\n    raise ValueError('bad config')\n")
    target = make(tmp_path)
    result, out = run(target, "--input-shape", "2,3")
    assert result.exit_code == 3, out
    assert target.rpartition(":")[0].rsplit("/", 1)[-1] in out
    assert fragment in out
    assert "Traceback" not in out


def test_bare_model_with_input_shape_and_tokens(tmp_path):
    (tmp_path / "m.py").write_text(
        "from torch import nn\n"
        "def mlp():\n    return nn.Linear(3, 5)\n"
        "def lm():\n    return nn.Sequential(nn.Embedding(11, 4), nn.Linear(4, 11))\n"
    )
    result, out = run(f"{tmp_path}/m.py:mlp", "--input-shape", "2x3", "--json", "--inference")
    assert result.exit_code == 0, out
    assert [(g["m"], g["n"], g["k"]) for g in json.loads(result.stdout)["gemms"]] == [(2, 5, 3)]
    result, out = run(f"{tmp_path}/m.py:lm", "--tokens", "2,6", "--vocab", "11", "--json")
    assert result.exit_code == 0, out
    doc = json.loads(result.stdout)
    assert doc["config"]["tokens"] == 12
    assert (12, 11, 4) in [(g["m"], g["n"], g["k"]) for g in doc["gemms"]]


@pytest.mark.parametrize(
    "args",
    [
        ["--batch", "0"],
        ["--batch", "-1"],
        ["--batch", "two"],
        ["--dtype", "fp12"],
        ["--amp", "fp32"],
        ["--optimizer", "lion"],
        ["--depth", "-1"],
    ],
)
def test_invalid_options_are_usage_errors(args):
    result, out = run(*MLP, *args)
    assert result.exit_code == 2, out
    assert "Traceback" not in out


@pytest.mark.parametrize("shape", ["8,x", "x", "0,3", "2,-3"])
def test_invalid_input_shape_is_a_usage_error(tmp_path, shape):
    (tmp_path / "m.py").write_text("from torch import nn\ndef f():\n    return nn.Linear(3, 5)\n")
    result, out = run(f"{tmp_path}/m.py:f", "--input-shape", shape)
    assert result.exit_code == 2, out
    assert "invalid --input-shape" in out
    assert "Traceback" not in out


def test_invalid_tokens_and_vocab(tmp_path):
    (tmp_path / "m.py").write_text("from torch import nn\ndef f():\n    return nn.Embedding(5, 3)\n")
    for extra in (["--tokens", "2,3,4"], ["--tokens", "2,3", "--vocab", "0"]):
        result, out = run(f"{tmp_path}/m.py:f", *extra)
        assert result.exit_code == 2, out


def test_data_dependent_model_exits_4_with_the_real_hint(tmp_path):
    (tmp_path / "dd.py").write_text(
        "import torch\nfrom torch import nn\n"
        "class M(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.fc = nn.Linear(3, 3)\n"
        "    def forward(self, x):\n        y = self.fc(x)\n        return y[y > 0]\n"
        "def f():\n    return M(), (torch.randn(2, 3),)\n"
    )
    result, out = run(f"{tmp_path}/dd.py:f")
    assert result.exit_code == 4, out
    assert "--real" in out and "aten::index" in out and "Traceback" not in out
    result, out = run(f"{tmp_path}/dd.py:f", "--real", "--json")
    assert result.exit_code == 0, out


@pytest.mark.parametrize(("flags", "scaler_ops"), [
    (["--amp", "fp16"], True),                        # default: fp16 autocast training scales
    (["--amp", "fp16", "--no-grad-scaler"], False),
    (["--amp", "bf16"], False),                       # nobody scales bf16
])
def test_grad_scaler_flag(flags, scaler_ops):
    result, _ = run(*MLP, "--by", "op", "--json", *flags)
    assert result.exit_code == 0, result.output
    ops = {row["op"] for row in json.loads(result.stdout)["ops"]}
    assert ("aten._amp_foreach_non_finite_check_and_unscale_" in ops) is scaler_ops
    assert ("aten._amp_update_scale_" in ops) is scaler_ops


def test_sdpa_unfused_traces_the_attention_as_its_kernels():
    gpt2 = ["gpt2", "-O", "n_layer=1", "--seq", "32", "--batch", "1", "--json"]
    fused, _ = run(*gpt2)
    unfused, _ = run(*gpt2, "--sdpa", "unfused")
    assert fused.exit_code == 0 and unfused.exit_code == 0, unfused.output
    ops = [{o["op"] for o in json.loads(r.stdout)["ops"]} for r in (fused, unfused)]
    assert "nnperf.attention" in ops[0] and "aten._softmax" not in ops[0]
    assert "nnperf.attention" not in ops[1] and "aten._softmax" in ops[1]
    assert json.loads(unfused.stdout)["config"]["sdpa"] == "unfused"


def test_an_unknown_sdpa_mode_is_one_line_with_the_valid_ones():
    result, out = run(*MLP, "--sdpa", "flash")
    assert result.exit_code == 2
    assert "'flash' is not one of 'fused', 'cudnn', 'unfused'" in out


def test_what_the_trace_assumed_is_printed_under_the_tables():
    result, out = run("tests/trace/test_trace_moe.py:GroupedMoE", "--input-shape", "2,16,64", "--dtype", "bf16")
    assert result.exit_code == 0, out
    assert "Note: MoE routing: values unknown to a fake trace; each token's top-2 of 8 experts" in out


@pytest.mark.parametrize(("args", "flag"), [
    (["resnet18", "-O", "image_size=32", "--batch", "2", "--sdpa", "unfused"], "--sdpa unfused"),
    (["gpt2", "-O", "n_layer=1", "--seq", "16", "--batch", "1", "--channels-last"], "--channels-last"),
])
def test_a_flag_that_changes_nothing_is_one_line_exit_2(args, flag):
    """--sdpa unfused on a model that calls no SDPA is refused like --channels-last on a model
    without 4-D tensors: one line, exit 2, no tables (found by a new-user trial)."""
    result, _ = run(*args)
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"nnperf: error: {flag} changes nothing here: ") and line.endswith("; leave it out")
