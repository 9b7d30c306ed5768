"""``nnperf bench transfer`` without a GPU: CPU column measured, GPU columns predicted."""

from __future__ import annotations

import json

import torch
from click.testing import CliRunner

from nnperf.cli.app import cli


def test_cpu_only_table_and_note():
    if torch.cuda.is_available():
        args = ["bench", "transfer", "--device", "cpu", "--sizes", "16,32", "--gpu", "a100", "--repeats", "2"]
    else:
        args = ["bench", "transfer", "--sizes", "16,32", "--gpu", "a100", "--repeats", "2"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "A100" in result.output and "Crossover" in result.output
    assert "only the CPU column is measured" in result.output


def test_json_and_bad_sizes():
    result = CliRunner().invoke(cli, ["bench", "transfer", "--device", "cpu", "--sizes", "24", "--json",
                                      "--repeats", "2"])
    doc = json.loads(result.output)
    row = doc["rows"][0]
    assert row["n"] == 24 and row["cpu_s"] > 0 and row["predicted_gpu_resident_s"] > 0
    bad = CliRunner().invoke(cli, ["bench", "transfer", "--sizes", "1,x"])
    assert bad.exit_code == 2 and "invalid --sizes" in bad.output
