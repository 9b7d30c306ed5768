"""The header of every table names the built-in model's -O changes: a saved table of
``llama-7b -O n_layer=2`` must not read as the full 7B model's (found by a new-user trial)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from nnperf.cli.app import cli
from nnperf.request import model_label

MLP = ["mlp", "-O", "widths=8,16,4", "--batch", "4"]
# written out by hand: the model, its -O change as typed, then the GPU's catalog name
HEADER = "mlp (widths=8,16,4) on H100 SXM5 80GB"


def run(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args), env={"COLUMNS": "250", "NNPERF_FIT_WORKERS": "1"})
    assert result.exit_code == 0, result.output
    return result.output


def test_the_label_lists_each_change_as_typed():
    assert model_label("llama-7b", {}) == "llama-7b"
    assert model_label("llama-7b", {"n_layer": 2}) == "llama-7b (n_layer=2)"
    assert model_label("gpt2", {"n_layer": 2, "n_embd": 256, "tie": False}) == \
        "gpt2 (n_layer=2, n_embd=256, tie=false)"


@pytest.mark.parametrize("command", ["predict", "fit"])
def test_predict_and_fit_headers(command):
    assert HEADER in run(command, *MLP, "--gpu", "h100").splitlines()[0]


def test_memory_header_and_summary_title():
    lines = run("memory", *MLP, "--gpu", "h100").splitlines()
    assert lines[0].startswith("mlp (widths=8,16,4): training")
    assert lines[1].startswith("mlp (widths=8,16,4) — peak device memory")


def test_analyze_and_compare_headers():
    assert run("analyze", *MLP).splitlines()[0].startswith("mlp (widths=8,16,4) — per module")
    assert run("compare", *MLP, "--gpus", "h100,a100").splitlines()[0].startswith(
        "mlp (widths=8,16,4) (train, batch 4) across GPUs")


def test_advise_header():
    first = run("advise", *MLP, "--gpu", "h100").splitlines()[0]
    assert first.startswith("Code changes for mlp (widths=8,16,4) on h100-sxm, host cloud-vm:")


def test_a_model_without_changes_keeps_its_name():
    assert run("predict", "mlp", "--batch", "4", "--gpu", "h100").startswith("mlp on H100 SXM5 80GB, host cloud-vm (")
