"""validation/kernel_bench.py's dry run on the CPU: every code path the GPU session takes, its
file readable by the calibration."""

from __future__ import annotations

import json

import pytest

from nnperf.measure.calibration.kernel_bench import SCHEMA, load_kernel_bench


@pytest.mark.slow
def test_the_cpu_dry_run_writes_every_kind_of_row(tmp_path, run_validation_script):
    out = tmp_path / "kernel-bench.json"
    done = run_validation_script("kernel_bench.py", "--device", "cpu", "--out", str(out), "--quick")
    assert done.returncode == 0, done.stderr
    doc = load_kernel_bench(out)
    assert doc["schema"] == SCHEMA and doc["complete"] and doc["quick"]
    kinds = {r["kind"] for r in doc["rows"]}
    assert kinds == {"batch_norm", "max_pool", "stem", "depthwise", "grouped", "dense", "layer_norm", "linear",
                     "sustained_gemm"}
    timed = [r for r in doc["rows"] if r["kind"] != "sustained_gemm"]
    assert all(("time_s" in r) != ("skipped" in r) for r in timed)  # each row timed or says why not
    assert {r["cudnn_benchmark"] for r in timed if r["kind"] == "stem"} == {False, True}
    bn = [r for r in timed if r["kind"] == "batch_norm" and r["dtype"] == "bf16" and "time_s" in r]
    assert bn and all("aten.native_batch_norm" in r["ops"] for r in bn)
    gemm = next(r for r in doc["rows"] if r["kind"] == "sustained_gemm")
    assert gemm["samples"] and gemm["first_second"]["flops_per_s"] > 0
    assert not list(tmp_path.glob(".*.tmp"))  # every write renamed into place
    json.loads(out.read_text())
