"""The second GPU run's script, dry: every item's code path on this CPU with tiny sizes, writing
the files the device run writes (a real process, the script as a GPU session calls it)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nnperf.measure.validation import load_records

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_dry_run_goes_through_every_item(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path), PYTHON=sys.executable)
    env.pop("BUDGET_S", None)
    done = subprocess.run(["bash", str(ROOT / "validation" / "gpu_run2.sh"), "--dry-run"], env=env,
                          capture_output=True, text=True, timeout=1800, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    files = {re.sub(r"-\d{8}T\d{6}\..*", "", p.name): p for p in tmp_path.iterdir()}  # name less its stamp
    expected = {"log-run2", "environment-run2", "records-fresh", "records-run2"}
    if (ROOT / "validation" / "kernel_bench.py").exists():
        expected.add("kernel-bench")
    if importlib.util.find_spec("nnperf.measure.calibration.host_parts") is not None:
        expected.add("host-parts")
    assert set(files) == expected and len(files) <= 8  # what comes back from a device call
    assert all(p.is_file() for p in tmp_path.iterdir())  # nothing deeper than $OUT/file

    log = files["log-run2"].read_text()
    for item in range(1, 7):
        assert f"== item {item}:" in log
    assert "left over" not in log and "gpu_run2 took" in log
    assert json.loads(files["environment-run2"].read_text())["torch"]

    fresh = {r["config"]: r for r in load_records(files["records-fresh"])}
    assert set(fresh) == {"hf:Qwen/Qwen2.5-0.5B-infer-bf16-b1-s64-tiny", "bert-base-infer-bf16-b1-s64-tiny",
                          "gpt2-train-fp16-b2-s64-tiny"}
    for name, record in fresh.items():
        if "error" in record:  # a library model where its library is not installed
            assert name.startswith("hf:") and "transformers" in record["error"]
        else:
            assert record["measured_step_time_s"]["n"] == 1 and record["unmatched_s"] is not None
            assert record["measured_step_time_back_to_back_s"] > 0
    assert "fresh configurations of frozen-2026-12-02.json" in log  # fresh_compare ran on them

    run2 = {r["config"]: r for r in load_records(files["records-run2"])}
    assert set(run2) == {"resnet50-infer-bf16-b2-tiny", "resnet50-infer-bf16-b2-cbm-tiny",
                         "mlp-train-bf16-b16-tiny", "llama-7b-infer-bf16-b1-s64-tiny"}
    assert run2["resnet50-infer-bf16-b2-tiny"]["measured_settings"]["cudnn_benchmark"] is False
    assert run2["resnet50-infer-bf16-b2-cbm-tiny"]["measured_settings"]["cudnn_benchmark"] is True
    host = run2["mlp-train-bf16-b16-tiny"]
    assert host["measured_step_time_s"]["n"] == 3 and host["measured_step_time_back_to_back_s"] > 0
    assert run2["llama-7b-infer-bf16-b1-s64-tiny"]["unmatched_s"] is not None
    assert all("runtime_estimator_step_time_s" not in r for r in run2.values())
