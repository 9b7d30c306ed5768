"""``validation/fresh_compare.py``: each fresh configuration against its frozen predictions and
today's model, on a frozen file and records written by hand."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from nnperf.measure.validation import RECORD_SCHEMA, Config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fresh_compare():
    sys.path.insert(0, str(ROOT / "validation"))
    try:
        import fresh_compare as module
    finally:
        sys.path.remove(str(ROOT / "validation"))
    return module


MEASURED = Config("mlp", False, "bf16", 64)
FAILED = Config("mnist-cnn", True, "fp16", 32)
MISSING = Config("mlp", True, "bf16", 8)


def _frozen(tmp_path: Path) -> Path:
    rows = [dict(c.to_json(), config=c.name, predicted_step_time_s=s, predicted_step_time_calibrated_s=cal)
            for c, s, cal in ((MEASURED, 0.8e-3, 1.5e-3), (FAILED, 2e-3, None), (MISSING, 1e-3, 1e-3))]
    path = tmp_path / "frozen.json"
    path.write_text(json.dumps({"schema": "nnperf.validation.fresh/1", "gpu": "h100", "model_commit": "abc",
                                "configs": rows}))
    return path


def _records(tmp_path: Path) -> Path:
    measured = dict(MEASURED.to_json(), schema=RECORD_SCHEMA, config=MEASURED.name, fits=True,
                    measured_step_time_s={"median": 1.0e-3, "min": 0.9e-3})
    failed = dict(FAILED.to_json(), schema=RECORD_SCHEMA, config=FAILED.name, error="RuntimeError: boom\nmore")
    path = tmp_path / "records.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in (measured, failed)) + "\n")
    return path


def test_frozen_errors_as_they_were_and_todays_beside_them(fresh_compare, tmp_path):
    frozen = json.loads(_frozen(tmp_path).read_text())
    from nnperf.measure.validation import load_records

    table = fresh_compare.rows(frozen, load_records(_records(tmp_path)), "h100", None)
    measured, failed, missing = table
    assert measured.measured_s == 1.0e-3 and measured.fastest_s == 0.9e-3
    assert measured.error("frozen_datasheet") == pytest.approx(-0.2)  # (0.8 - 1.0) / 1.0
    assert measured.error("frozen_calibrated") == pytest.approx(0.5)  # (1.5 - 1.0) / 1.0
    assert measured.today_datasheet is not None and measured.today_datasheet > 0
    assert measured.today_calibrated is None  # no calibrated profile given
    assert failed.error("frozen_datasheet") is None and failed.note == "not measured: RuntimeError: boom"
    assert missing.note == "not measured: no record"
    stats = fresh_compare.summary(table)
    assert stats["frozen_datasheet"] == {"n": 1, "median_ape": pytest.approx(20.0), "p90_ape": pytest.approx(20.0)}
    assert stats["today_calibrated"]["n"] == 0


def test_a_dry_runs_tiny_stand_in_is_matched_to_its_configuration(fresh_compare, tmp_path):
    sys.path.insert(0, str(ROOT / "validation"))
    try:
        from fresh import tiny
    finally:
        sys.path.remove(str(ROOT / "validation"))
    frozen = json.loads(_frozen(tmp_path).read_text())
    stand_in = tiny(MEASURED)
    record = dict(stand_in.to_json(), schema=RECORD_SCHEMA, config=stand_in.name,
                  measured_step_time_s={"median": 2e-3, "min": 2e-3})
    row = fresh_compare.rows(frozen, [record], None, None)[0]
    assert row.measured_s == 2e-3 and f"measured as {stand_in.name}" in row.note
    assert row.today_datasheet is None  # no GPU named: no prediction today, not a zero


def test_the_command_prints_markdown_and_json_and_refuses_a_wrong_file(fresh_compare, tmp_path, capsys):
    frozen, records = _frozen(tmp_path), _records(tmp_path)
    assert fresh_compare.main([str(frozen), str(records), "--markdown"]) == 0
    out = capsys.readouterr().out
    assert f"| {MEASURED.name} | 1.00 | 0.80 (-20.0%) | 1.50 (+50.0%) |" in out
    assert f"{MISSING.name}: not measured: no record" in out
    assert fresh_compare.main([str(frozen), str(records), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["rows"][0]["frozen_datasheet_error"] == pytest.approx(-0.2)
    assert fresh_compare.main([str(records), str(records)]) == 2
    assert "not a frozen configuration file" in capsys.readouterr().err
