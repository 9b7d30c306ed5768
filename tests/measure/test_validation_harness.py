"""The GPU validation harness on the CPU: order, selection, shards, resume, budget, and the
CI check that recomputes committed error tables (a CPU-made fixture and every GPU folder).

The GPU folders hold runs of library models (``hf:``, ``timm:``, ``tv:``), so the tables are
recomputed where those libraries are installed (marker ``libraries``: CI's build with the
extras); elsewhere they are skipped, naming the missing library."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nnperf.measure.validation import (
    Config,
    calibrated_profile,
    default_configs,
    error_tables,
    load_records,
    regressions,
    repredict,
    select,
)
from nnperf.measure.validation_plan import MODEL_PRIORITY, ordered_configs, shard

#: What building a library model needs importing (``nnperf.hub.PREFIXES``).
LIBRARY_IMPORTS = {"hf": ("transformers",), "timm": ("torchvision", "timm"), "tv": ("torchvision",)}

pytestmark = pytest.mark.accuracy

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).parent / "data" / "validation-dry-run"


def committed_folders() -> list[Path]:
    """The CPU fixture and every GPU data folder that carries a baseline."""
    return [FIXTURE, *(p.parent for p in sorted((ROOT / "validation" / "data").glob("*/baseline.json")))]


def missing_library(records: list[dict]) -> str | None:
    """The first library a record's model needs that does not import here, or None."""
    import importlib

    from nnperf.hub import split

    for prefix in sorted({named[0] for r in records if (named := split(r["model"]))}):
        for module in LIBRARY_IMPORTS[prefix]:
            try:
                importlib.import_module(module)
            except Exception as err:  # absent, or built for another torch
                return f"{module} ({type(err).__name__})"
    return None


@pytest.fixture(scope="module")
def repredicted() -> dict[Path, list[dict]]:
    """Each committed folder's measured records, predicted again on their GPU (datasheet and
    calibrated): a minute of CPU for the H200's, shared by the error tables and the accuracy
    table's check."""
    records_of = {folder: [r for r in load_records(folder) if r.get("fits", True) and "measured_step_time_s" in r]
                  for folder in committed_folders()}
    missing = missing_library([r for records in records_of.values() for r in records])
    if missing:
        pytest.skip(f"the committed runs include library models and {missing} does not import here "
                    "(CI checks them on its build with the extras)")
    out = {}
    for folder, records in records_of.items():
        for r in records:
            repredict(r, r.get("gpu"), calibrated_profile(folder, r.get("gpu")))
        out[folder] = records
    return out


@pytest.mark.libraries
@pytest.mark.parametrize("folder", committed_folders(), ids=lambda p: p.name)
def test_committed_error_tables_do_not_regress(folder: Path, repredicted):
    records = repredicted[folder]
    assert records
    baseline = json.loads((folder / "baseline.json").read_text())
    assert regressions(error_tables(records), baseline) == []


@pytest.mark.libraries
def test_the_committed_accuracy_table_follows_the_current_model_on_nnperfs_runs(repredicted):
    """nnperf's own GPU runs (``nnperf.accuracy``), from the predictions the error tables were
    just recomputed from: a model change that moves any prediction fails here until the table
    is rewritten in the same commit. (The published rows' part is checked in
    ``test_published.py``, beside their error tables.)"""
    from nnperf.accuracy import REGENERATE, load_table
    from nnperf.measure.accuracy_table import harness_runs, is_published, stale_rows

    gpu_folders = [f for f in committed_folders() if f != FIXTURE]
    assert gpu_folders
    fresh = [run for folder in gpu_folders for run in harness_runs(folder, repredicted[folder])]
    stale = stale_rows([r for r in load_table() if not is_published(r)], fresh)
    assert stale == [], f"{len(stale)} runs moved; regenerate the table: {REGENERATE}"


def test_regressions_name_what_got_worse():
    row = {"n": 4, "skipped": 0, "median_ape": 5.0, "p90_ape": 10.0, "worst_ape": 12.0, "worst_config": "x"}
    base = {"t": {"overall": row}}
    assert regressions({"t": {"overall": dict(row, median_ape=5.4)}}, base) == []
    worse = regressions({"t": {"overall": dict(row, p90_ape=11.0)}}, base)
    assert worse == ["t / overall: p90_ape 10.00% -> 11.00%"]
    assert "4 records compared before, 3 now" in regressions({"t": {"overall": dict(row, n=3)}}, base)[0]


def test_only_selects_a_model_exactly_or_by_glob_or_by_prefix():
    configs = default_configs()
    assert {c.model for c in select(configs, ["gpt2"])} == {"gpt2"}  # not gpt2-medium
    assert {c.model for c in select(configs, ["gpt2*"])} >= {"gpt2", "gpt2-medium", "gpt2-xl"}
    assert [c.name for c in select(configs, ["mlp-infer-bf16"])] == ["mlp-infer-bf16-b64", "mlp-infer-bf16-b1024"]
    assert {c.precision for c in select(configs, ["*-train-bf16-*"])} == {"bf16"}


def test_order_sees_every_model_once_before_any_repeat():
    ordered = ordered_configs()
    assert sorted(c.name for c in ordered) == sorted(c.name for c in default_configs())
    first = ordered[: len(MODEL_PRIORITY)]
    assert [c.model for c in first] == list(MODEL_PRIORITY)
    assert all(c.train and c.precision == "bf16" for c in first)


def test_shards_split_the_list_without_overlap():
    configs = ordered_configs()
    parts = [shard(configs, f"{i}/3") for i in (1, 2, 3)]
    assert sorted(c.name for p in parts for c in p) == sorted(c.name for c in configs)
    assert abs(len(parts[0]) - len(parts[2])) <= 1
    for bad in ("0/3", "4/3", "x", "1/"):
        with pytest.raises(ValueError, match="I/N"):
            shard(configs, bad)


def test_a_torn_last_line_is_skipped(tmp_path):
    good = {"schema": "nnperf.validation.record/1", "config": "a"}
    path = tmp_path / "records.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(dict(good, config="b")) + "\n" + '{"schema": "nnp')
    assert [r["config"] for r in load_records(path)] == ["a", "b"]


def test_tiny_config_round_trips_through_its_record():
    config = next(c for c in ordered_configs(tiny=True) if c.model == "llama-7b")
    assert config.name.endswith("-tiny") and dict(config.overrides)["n_layer"] == 1
    assert Config.from_record(config.to_json()) == config


def test_harness_appends_resumes_and_keeps_to_its_budget(tmp_path, capsys):
    harness = _harness()
    out = tmp_path / "records.jsonl"
    argv = ["--device", "cpu", "--tiny", "--only", "mlp-infer-fp32-b16-tiny", "--steps", "2",
            "--warmup", "1", "--out", str(out)]
    assert harness.main(argv) == 0
    (record,) = load_records(out)
    assert record["config"] == "mlp-infer-fp32-b16-tiny" and record["measured_peak_memory_bytes"] > 0
    assert record["unmatched_s"] >= 0.0 and record["matched_s"] > 0.0  # profiled, what was not attributed
    assert record["measured_settings"] == {"tf32_matmul": False, "cudnn_benchmark": False}
    assert record["measured_step_time_back_to_back_s"] is None  # not asked for
    assert harness.main(argv) == 0  # resumed: nothing left to run
    assert len(out.read_text().splitlines()) == 1
    other = tmp_path / "other.jsonl"
    assert harness.main([*argv[:-1], str(other), "--budget-s", "0.001", "--only", "mlp-train-fp32-b16-tiny"]) == 0
    assert not other.exists() or not load_records(other)
    assert "budget spent: 2 configurations left" in capsys.readouterr().out


def test_cudnn_benchmark_is_part_of_a_configuration_and_its_record():
    on = Config("resnet50", True, "bf16", 64, cudnn_benchmark=True)
    assert on.name == "resnet50-train-bf16-b64-cbm"
    assert Config.from_record(on.to_json()) == on
    old = {k: v for k, v in on.to_json().items() if k != "cudnn_benchmark"}  # a first-run record
    assert Config.from_record(old).cudnn_benchmark is False
    assert on.timing_options().cudnn_benchmark is True and on.timing_options().tf32_matmul is False
    with pytest.raises(ValueError, match=r"cudnn_benchmark is 'yes'; expected true or false"):
        Config.from_record(dict(on.to_json(), cudnn_benchmark="yes", config=on.name))


def test_repredict_predicts_with_the_records_settings(predicted_timings):
    seen = predicted_timings
    record = Config("mlp", False, "tf32", 16, cudnn_benchmark=True).to_json()
    repredict(record, "h100")
    assert [(t.tf32_matmul, t.cudnn_benchmark) for t in seen] == [(True, True)]


def test_second_run_lists():
    from nnperf.measure.validation_plan import CONFIG_SETS, cnn_pairs, host_bound, reprofile

    pairs = cnn_pairs()
    assert len(pairs) == 6 * 2 * 2  # six CNN steps x {bf16, fp16} x benchmark off/on
    names = {c.name for c in pairs}
    assert {"resnet50-train-bf16-b64", "resnet50-train-bf16-b64-cbm", "resnet50-infer-fp16-b64-cbm",
            "convnext_tiny-train-fp16-b128-cbm", "vgg16-train-bf16-b64"} <= names
    assert sum(c.cudnn_benchmark for c in pairs) == 12
    assert [c.name for c in host_bound()] == [
        "bert-base-train-bf16-b32", "bert-base-infer-bf16-b32", "bert-large-infer-bf16-b16",
        "mlp-train-bf16-b1024", "mlp-infer-bf16-b1024", "mnist-cnn-train-bf16-b512", "mnist-cnn-infer-bf16-b512"]
    assert [c.name for c in reprofile()] == ["llama-7b-infer-bf16-b2", "mixtral-8x7b-train-bf16-b2"]
    assert dict(reprofile()[1].overrides) == {"n_layer": 2}  # as the first run measured it
    assert all(c.tiny for c in cnn_pairs(tiny=True))
    assert set(CONFIG_SETS) == {"zoo", "cnn-pairs", "host-bound", "reprofile"}


def _harness():
    import sys

    sys.path.insert(0, str(ROOT / "validation"))
    try:
        import run as harness
    finally:
        sys.path.remove(str(ROOT / "validation"))
    return harness


def test_fresh_configurations_are_listed_from_the_frozen_file(capsys):
    harness = _harness()
    frozen = ROOT / "validation" / "fresh" / "frozen-2026-12-02.json"
    assert harness.main(["--fresh", str(frozen), "--list"]) == 0
    names = capsys.readouterr().out.split()
    assert len(names) == len(json.loads(frozen.read_text())["configs"]) == 22
    assert names[0] == "hf:Qwen/Qwen2.5-0.5B-train-bf16-b8-s512"
    assert harness.main(["--fresh", str(frozen), "--list", "--tiny"]) == 0
    assert all(n.endswith("-tiny") for n in capsys.readouterr().out.split())
    assert harness.main(["--fresh", str(ROOT / "validation" / "run.py"), "--list"]) == 2
    assert "--fresh" in capsys.readouterr().err
