"""nnperf advise on the command line: JSON, --apply with an unknown name (one line, exit 2),
a model that cannot be traced (the trace's error and exit code, as analyze gives them)."""

from __future__ import annotations

import json
import textwrap

from click.testing import CliRunner

from nnperf.cli.app import cli

TINY = ["-O", "n_layer=1", "-O", "n_embd=64", "-O", "n_head=2", "--seq", "32", "--batch", "2"]


def test_json_ranks_items_by_gain_and_lists_what_gains_nothing(monkeypatch):
    monkeypatch.setenv("NNPERF_FIT_WORKERS", "1")
    r = CliRunner().invoke(cli, ["advise", "gpt2", *TINY, "--gpu", "a100", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    gains = [i["gain_s"] for i in doc["items"]]
    assert gains == sorted(gains, reverse=True) and all(g > 0 for g in gains)
    for item in doc["items"]:
        before, after = item["before"], item["after"]
        per_sample = before["step_time_s"] / before["batch"] - after["step_time_s"] / after["batch"]
        assert abs(item["gain_s"] - per_sample * before["batch"]) < 1e-12
        assert item["change"] and item["assumptions"]
    assert doc["gains_nothing"]  # e.g. the for-loop optimizer, recomputation at the same batch
    # other GPUs: a list of their own, fastest first, never ranked among the code changes
    assert doc["gpus"] and {g["family"] for g in doc["gpus"]} == {"gpu"}
    assert not any(i["family"] == "gpu" for i in doc["items"] + doc["gains_nothing"] + doc["not_predicted"])
    gpu_gains = [g["gain_s"] for g in doc["gpus"]]
    assert gpu_gains == sorted(gpu_gains, reverse=True)
    # how far to trust the given step's time: its track record, as predict --json gives it
    given = CliRunner().invoke(cli, ["predict", "gpt2", *TINY, "--gpu", "a100", "--json"])
    assert doc["track_record"] == json.loads(given.output)["track_record"]


def test_terminal_and_html_show_other_gpus_in_their_own_table(monkeypatch, tmp_path):
    monkeypatch.setenv("NNPERF_FIT_WORKERS", "1")
    monkeypatch.setenv("COLUMNS", "250")
    page = tmp_path / "advice.html"
    r = CliRunner().invoke(cli, ["advise", "gpt2", *TINY, "--gpu", "a100", "--html", str(page)])
    assert r.exit_code == 0, r.output
    code, _, gpus = r.output.partition("The same step on other GPUs")
    assert gpus and "h100-sxm" in gpus and "USD" in gpus
    assert "h100-sxm" not in code and "gpu-" not in code  # no GPU row among the code changes
    # a change's text is printed as written: the compiled loss's "[compile]" is not rich markup
    assert 'torchtitan: [compile] components = ["loss"]' in code
    assert "the given step: runs like this one:" in code  # under the headline step time
    html = page.read_text()
    code_html, _, gpu_html = html.partition("The same step on other GPUs")
    assert "h100-sxm" in gpu_html and "gpu-h100-sxm" not in code_html


def test_unknown_apply_name_is_one_line_with_the_valid_names():
    r = CliRunner().invoke(cli, ["advise", "gpt2", *TINY, "--gpu", "a100", "--apply", "amp-bf16,warp-drive"])
    assert r.exit_code == 2
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and "warp-drive" in lines[0] and "amp-bf16" in lines[0] and "valid:" in lines[0]


def test_a_model_that_cannot_be_traced_gives_the_trace_error(tmp_path):
    f = tmp_path / "bad.py"
    f.write_text(textwrap.dedent("""
        import torch
        from torch import nn
        def build():
            return nn.Linear(64, 8), (torch.randn(4, 32),)
    """))
    analyze = CliRunner().invoke(cli, ["analyze", f"{f}:build"])
    advise = CliRunner().invoke(cli, ["advise", f"{f}:build", "--gpu", "a100"])
    assert advise.exit_code == analyze.exit_code != 0
    assert advise.output.strip().splitlines()[-1] == analyze.output.strip().splitlines()[-1]


def test_a_combination_lists_every_items_change(monkeypatch):
    """The table shows a change's first line; --apply a,b prints each item's change below it."""
    monkeypatch.setenv("NNPERF_FIT_WORKERS", "1")
    r = CliRunner().invoke(cli, ["advise", "gpt2", *TINY, "--gpu", "a100", "--apply", "amp-bf16,optimizer-fused"])
    assert r.exit_code == 0, r.output
    changes = r.output.partition("  changes:")[2]
    assert "--amp bf16" in changes and "--optimizer-impl fused" in changes


def test_gpus_left_out_of_the_other_gpu_table_are_named_with_why(monkeypatch):
    """AMD GPUs and, under --amp bf16, GPUs without bf16 are not compared; each is listed with
    the reason in JSON and text, so a GPU missing from the table is not read as slower
    (found by a new-user trial)."""
    from nnperf.hardware import list_gpus

    monkeypatch.setenv("NNPERF_FIT_WORKERS", "1")
    monkeypatch.setenv("COLUMNS", "250")
    mlp = ["advise", "mlp", "-O", "widths=8,16,4", "--batch", "4", "--gpu", "h100", "--amp", "bf16"]
    doc = json.loads(CliRunner().invoke(cli, [*mlp, "--json"]).output)
    left = {g["gpu"]: g["why"] for g in doc["gpus_not_compared"]}
    compared = {g["change"].removeprefix("--gpu ") for g in doc["gpus"]}
    # every catalog GPU is the given one, a table row or named as left out, exactly once
    assert sorted([*left, *compared, "h100-sxm"]) == sorted(g.id for g in list_gpus())
    assert {g for g, why in left.items() if why.startswith("AMD")} == {"mi250x", "mi300x"}
    assert {"v100-sxm2", "t4"} <= {g for g, why in left.items() if "no bf16" in why}  # Volta, Turing
    text = CliRunner().invoke(cli, mlp).output
    assert "GPUs not compared: mi250x, mi300x: AMD GPUs" in text
    assert "nnperf compare --gpus" in text
