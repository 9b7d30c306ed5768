"""validation/host_gap.py's dry run on the CPU: every part the GPU session ran, its file whole."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_cpu_dry_run_writes_every_part(tmp_path):
    out = tmp_path / "host-gap.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, str(ROOT / "validation" / "host_gap.py"), "--device", "cpu", "--dry-run",
                           "--out", str(out)], capture_output=True, text=True, env=env, timeout=600, check=False)
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
