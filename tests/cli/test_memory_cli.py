"""``nnperf memory`` and ``nnperf fit`` from the command line."""

from __future__ import annotations

import json

from click.testing import CliRunner

from nnperf.cli.app import cli


def test_memory_json_extends_the_analysis_document():
    res = CliRunner().invoke(cli, ["memory", "mlp", "--batch", "4", "--json",
                                   "--timeline-points", "50"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert "totals" in doc and "ops" in doc  # the analysis document is still there
    mem = doc["memory"]
    for key in ("peak_allocated", "peak_reserved_estimate", "device_total_estimate",
                "breakdown", "saved_activations", "timeline"):
        assert key in mem
    assert 0 < len(mem["timeline"]) <= 50
    assert set(mem["timeline"][0]) >= {"index", "phase", "module", "allocated"}
    assert mem["peak_allocated"] <= mem["peak_reserved_estimate"] < mem["device_total_estimate"]


def test_memory_tables_print():
    res = CliRunner().invoke(cli, ["memory", "mlp", "--batch", "4", "--gpu", "a100-40gb"])
    assert res.exit_code == 0, res.output
    assert "peak allocated" in res.output and "device total" in res.output


def test_fit_unknown_gpu_is_a_usage_error():
    res = CliRunner().invoke(cli, ["fit", "mlp", "--gpu", "no-such-gpu"])
    assert res.exit_code == 2
    assert "no-such-gpu" in res.output


def test_fit_too_small_gpu_says_what_batch_1_needs():
    res = CliRunner().invoke(cli, ["fit", "gpt2", "-O", "n_layer=1", "--gpu", "a100-40gb",
                                   "--set", "memory_gib=0.25", "--no-what-ifs"])
    assert res.exit_code == 5, res.output
    assert "at batch 1" in res.output and "does not fit" in res.output


def test_memory_checks_the_workload_options_like_analyze():
    res = CliRunner().invoke(cli, ["memory", "mlp", "--batch", "0"])
    assert res.exit_code == 2 and "invalid --batch 0" in res.output
    res = CliRunner().invoke(cli, ["memory", "x.py:f", "--tokens", "2,7", "--vocab", "0"])
    assert res.exit_code == 2 and "invalid --vocab 0" in res.output


def test_fit_does_not_use_a_valid_batch_and_refuses_an_invalid_one():
    res = CliRunner().invoke(cli, ["fit", "mlp", "--batch", "3", "--gpu", "a100-40gb",
                                   "--no-what-ifs", "--max-batch", "16", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["results"][0]["largest_batch"] == 16
    res = CliRunner().invoke(cli, ["fit", "mlp", "--batch", "0", "--gpu", "a100-40gb"])
    assert res.exit_code == 2
    assert res.output == "nnperf: error: invalid --batch 0: expected an integer from 1 to 2,147,483,647\n"


def test_validate_refuses_a_file_without_measured_memory(tmp_path):
    bogus = tmp_path / "analysis.json"
    bogus.write_text('{"schema": "nnperf.analysis/1", "model": "mlp", "totals": {}}')
    res = CliRunner().invoke(cli, ["memory", "mlp", "--batch", "4", "--validate", str(bogus)])
    assert res.exit_code == 2
    assert "holds no measured peak memory" in res.output


def test_fit_refuses_inputs_of_a_fixed_batch(tmp_path):
    model = tmp_path / "m.py"
    model.write_text("from torch import nn\ndef net():\n    return nn.Linear(64, 8)\n")
    res = CliRunner().invoke(cli, ["fit", f"{model}:net", "--input-shape", "8,64", "--gpu", "h100"])
    assert res.exit_code == 2
    assert "fit searches over the batch size, but --input-shape 8,64 fixes it" in res.output
