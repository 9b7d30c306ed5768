"""The predicted Chrome trace: two tracks, and host slices that agree with the simulation."""

from __future__ import annotations

import json

import pytest

from nnperf.report.chrome_trace import (
    DEVICE_PID,
    HOST_PID,
    chrome_trace,
    write_chrome_trace,
)


def test_kernels_start_at_issue_or_after_previous_kernel(mlp_prediction):
    issued = {h.index: h.end_s for h in mlp_prediction.step.host_slices}
    prev_end = 0.0
    for t in mlp_prediction.step.ops:
        if not t.kernels:
            continue
        assert t.start_s == pytest.approx(max(issued[t.index], prev_end), abs=1e-12)
        prev_end = t.end_s
    assert max(prev_end, max(issued.values())) == pytest.approx(mlp_prediction.step.step_s)


def test_trace_document_tracks_and_flows(mlp_prediction, tmp_path):
    doc = chrome_trace(mlp_prediction)
    ev = doc["traceEvents"]
    names = {(e["pid"], e["args"]["name"]) for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    assert (HOST_PID, "host (predicted)") in names
    assert any(pid == DEVICE_PID for pid, _ in names)
    device = [e for e in ev if e["ph"] == "X" and e["pid"] == DEVICE_PID]
    assert len(device) == sum(1 for t in mlp_prediction.step.ops if t.kernels)
    assert sum(e["dur"] for e in device) == pytest.approx(mlp_prediction.step.device_busy_s * 1e6, abs=1e-4 * len(device))  # 0.1 ns rounding each
    starts = {e["id"] for e in ev if e["ph"] == "s"}
    ends = {e["id"] for e in ev if e["ph"] == "f"}
    assert starts == ends and len(ends) == len(device)
    path = write_chrome_trace(mlp_prediction, tmp_path / "t.json")
    assert json.loads(path.read_text())["otherData"]["step_time_s"] == mlp_prediction.step.step_s
