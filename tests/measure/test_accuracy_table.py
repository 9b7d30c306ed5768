"""The accuracy table: its rows from measurements, the staleness check, and (marker
``accuracy``) the committed table against the current model."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from nnperf import predict
from nnperf.accuracy import MeasuredRun, RunTraits
from nnperf.measure.accuracy_table import (
    TOLERANCE,
    harness_runs,
    published_runs,
    stale_rows,
)
from nnperf.measure.validation import RECORD_SCHEMA

ROOT = Path(__file__).resolve().parents[2]
TRAITS = RunTraits("h200-sxm", "H200 SXM 141GB", "NVIDIA", "Hopper", "data-centre", "mlp", "bf16", "inference", "host")


def test_a_harness_record_becomes_a_run_with_todays_error(tmp_path):
    folder = tmp_path / "h200-sxm"
    folder.mkdir()
    record = {"schema": RECORD_SCHEMA, "model": "mlp", "train": False, "precision": "bf16", "batch": 64,
              "gpu": "h200-sxm", "fits": True, "measured_step_time_s": {"median": 2.5e-4}}
    skipped = {**record, "batch": 1024, "fits": False}  # "does not fit": no step time to compare
    (folder / "records-1.jsonl").write_text(json.dumps(record) + "\n" + json.dumps(skipped) + "\n")
    (run,) = harness_runs(folder)
    predicted = predict("mlp", "h200", train=False, amp="bf16", batch=64).step.step_s
    assert run.id == "mlp-infer-bf16-b64" and run.source == "nnperf-h200-sxm"
    assert run.error == pytest.approx(predicted / 2.5e-4 - 1, abs=5e-5)
    assert replace(run.traits, bound="host") == TRAITS  # the bound is the prediction's, checked below
    assert run.traits.bound == predict("mlp", "h200", train=False, amp="bf16", batch=64).step.bound


def test_a_published_row_becomes_a_run_with_its_grade_and_precision(tmp_path):
    (tmp_path / "rows.toml").write_text("""
[[measurement]]
id = "row-1"
model = "timm mobilenetv2_100"
task = "inference"
gpu = "RTX 3090"
gpu_catalog = "rtx-3090"
gpus = 1
batch = 8
image_size = 224
nnperf_precision = "amp-fp16"
value = 1000.0
grade = "faithful"

[[measurement]]
id = "row-2"
model = "timm mobilenetv2_100"
task = "inference"
gpu = "8x RTX 3090"
gpu_catalog = "rtx-3090"
gpus = 8
batch = 8
nnperf_precision = "amp-fp16"
value = 8000.0
grade = "out-of-scope"
""")
    (run,) = published_runs(tmp_path)  # row-2 needs 8 GPUs: not a run of the table
    predicted = predict("mobilenet_v2", "rtx-3090", train=False, amp="fp16", batch=8, image_size=224).step.step_s
    assert (run.id, run.source, run.grade) == ("row-1", "published:rows.toml", "faithful")
    assert run.error == pytest.approx(predicted / (8 / 1000.0) - 1, abs=5e-5)  # batch / images per s
    t = run.traits
    assert (t.gpu, t.segment, t.architecture, t.family, t.precision, t.mode) == (
        "rtx-3090", "consumer", "Ampere", "cnn", "fp16", "inference")


def runs(*errors: float) -> list[MeasuredRun]:
    return [MeasuredRun(f"r{i}", "test", None, TRAITS, e) for i, e in enumerate(errors)]


def test_a_table_within_rounding_is_current():
    assert stale_rows(runs(-0.4108, 0.1), runs(-0.4109, 0.1)) == []
    assert TOLERANCE < 2e-4


def test_a_moved_error_a_changed_trait_or_a_missing_run_is_stale():
    assert stale_rows(runs(-0.41, 0.1), runs(-0.35, 0.1)) == ["r0: error -0.4100 in the table, -0.3500 now"]
    moved = [replace(runs(0.1)[0], traits=replace(TRAITS, bound="compute"))]
    assert stale_rows(runs(0.1), moved) == ["r0: traits bound 'host' -> 'compute'"]
    assert stale_rows(runs(0.1, 0.2), runs(0.1)) == ["r1: in the table, not built now"]
    assert stale_rows(runs(0.1), runs(0.1, 0.2)) == ["r1: built now, not in the table"]
