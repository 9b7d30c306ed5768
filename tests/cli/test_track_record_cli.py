"""Every prediction's track record where its step time is shown: predict (terminal and
--json), compare, and the HTML report; and a GPU nothing measured resembles, said plainly."""

from __future__ import annotations

import json

from click.testing import CliRunner

from nnperf.accuracy import RunTraits, gpu_traits, track_record
from nnperf.cli.app import cli
from nnperf.hardware import load_gpu

MLP = ["mlp", "--batch", "8"]


def expected(gpu: str, bound: str, family: str = "mlp", precision: str = "fp32", mode: str = "train"):
    """The record of the workload's traits, spelled out here rather than read from the prediction."""
    return track_record(RunTraits(**gpu_traits(load_gpu(gpu)), family=family, precision=precision, mode=mode,
                                  bound=bound))


def test_predict_json_carries_the_track_record_of_its_traits():
    r = CliRunner().invoke(cli, ["predict", *MLP, "--gpu", "h200", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    record = expected("h200", doc["totals"]["bound"])
    assert doc["track_record"] == record.to_json()
    # the committed table holds H200 runs: MLP training on the H200 is cited, not guessed
    assert doc["track_record"]["n"] > 0 and set(doc["track_record"]) >= {
        "median_abs_error", "median_signed_error", "n", "matched", "relaxed"}


def test_predict_prints_the_track_record_under_the_step():
    r = CliRunner().invoke(cli, ["predict", *MLP, "--gpu", "h200", "--amp", "bf16", "--depth", "0"],
                           env={"COLUMNS": "250"})
    assert r.exit_code == 0, r.output
    bound = next(line for line in r.output.splitlines() if "│ bound" in line).split("│")[2].strip()
    assert expected("h200", bound, precision="bf16").text() in r.output


def test_a_gpu_nothing_measured_resembles_says_so():
    r = CliRunner().invoke(cli, ["predict", *MLP, "--gpu", "mi300x", "--depth", "0"], env={"COLUMNS": "250"})
    assert r.exit_code == 0, r.output
    assert "runs like this one: none measured (no 32-bit training run on data-centre AMD GPUs)" in r.output


def test_compare_shows_each_gpus_track_record():
    r = CliRunner().invoke(cli, ["compare", *MLP, "--gpus", "h200,mi300x", "--json"])
    assert r.exit_code == 0, r.output
    rows = {row["id"]: row for row in json.loads(r.output)["gpus"]}
    assert rows["h200-sxm"]["track_record"] == expected("h200", rows["h200-sxm"]["bound"]).to_json()
    assert rows["mi300x"]["track_record"]["n"] == 0
    table = CliRunner().invoke(cli, ["compare", *MLP, "--gpus", "h200,mi300x"], env={"COLUMNS": "250"})
    assert "Runs like it" in table.output and "none measured" in table.output
    assert expected("h200", rows["h200-sxm"]["bound"]).cell() in table.output


def test_html_report_shows_the_track_record(tmp_path):
    out = tmp_path / "r.html"
    r = CliRunner().invoke(cli, ["report", *MLP, "--gpu", "h200", "-o", str(out)])
    assert r.exit_code == 0, r.output
    page = out.read_text()
    record = json.loads(CliRunner().invoke(cli, ["predict", *MLP, "--gpu", "h200", "--json"]).output)["track_record"]
    assert "runs like this one" in page and f"median error {record['median_abs_error']:.0%}" in page
    assert f"n={record['n']}: {record['runs_like']}" in page
    both = tmp_path / "cmp.html"
    r = CliRunner().invoke(cli, ["report", *MLP, "--gpus", "h200,mi300x", "-o", str(both)])
    assert r.exit_code == 0, r.output
    page = both.read_text()
    assert "Runs like it" in page and "none measured" in page
