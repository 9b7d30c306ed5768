"""validation/host_gap.py's dry run on the CPU: every part the GPU session ran, its file whole."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_the_cpu_dry_run_writes_every_part(tmp_path, run_validation_script):
    out = tmp_path / "host-gap.json"
    done = run_validation_script("host_gap.py", "--device", "cpu", "--dry-run", "--out", str(out), timeout=600)
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    assert doc["schema"] == "nnperf.host_gap/1" and doc["environment"]["torch"]
    assert not any("error" in doc[part] for part in ("ops", "phases", "profiles"))
    assert {name.split("/")[1] for name in doc["ops"]} == {"tiny", "real"}
    mlp = doc["phases"]["mlp-train-bf16-b16-tiny"]
    assert set(mlp["parts_s"]) == {"forward", "loss", "backward", "after_backward", "optimizer", "zero_grad"}
    assert all(v > 0 for v in mlp["parts_s"].values()) and mlp["host_s"] > 0
    assert doc["phases"]["bert-base-infer-bf16-b1-s64-tiny"]["parts_s"].keys() == {"forward"}
    assert all(p["rows"] and p["cpu_self_all_s"] > 0 for p in doc["profiles"].values())
    assert not list(tmp_path.glob("*.tmp"))
