"""The predicted step as a Chrome trace event file (opens in Perfetto and chrome://tracing).

Two tracks, as a profiler shows a real eager step: the host thread dispatching every op (views
included: they cost host time too) and the device stream running the kernels. Flow arrows join
each dispatch to its kernel, so host-bound gaps are visible as arrows pointing into idle time.
Loading it next to the measured trace ``nnperf measure --trace-out`` writes lets a reader
compare the two timelines in one tool.

The host slices are the ones the timing pass recorded while simulating the step, so the two
tracks cannot disagree with the predicted step time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nnperf.prediction import Prediction

HOST_PID, DEVICE_PID = 1, 2
HOST_TID, DEVICE_TID = 1, 7  # 7: the default CUDA stream id in PyTorch's own traces


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 4)


def chrome_trace(prediction: Prediction) -> dict[str, Any]:
    """The trace document: ``traceEvents`` with complete ('X') slices, flows and track names."""
    gpu = prediction.gpu.name
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": HOST_PID, "args": {"name": "host (predicted)"}},
        {"ph": "M", "name": "thread_name", "pid": HOST_PID, "tid": HOST_TID, "args": {"name": "dispatch"}},
        {"ph": "M", "name": "process_name", "pid": DEVICE_PID, "args": {"name": f"{gpu} (predicted)"}},
        {"ph": "M", "name": "thread_name", "pid": DEVICE_PID, "tid": DEVICE_TID, "args": {"name": "stream 7"}},
    ]
    for h in prediction.step.host_slices:
        events.append({
            "ph": "X", "cat": "host", "name": h.name, "pid": HOST_PID, "tid": HOST_TID,
            "ts": _us(h.start_s), "dur": _us(h.end_s - h.start_s),
            "args": {"module": h.module, "phase": h.phase, "index": h.index},
        })
        if h.launches:
            events.append({"ph": "s", "cat": "dispatch", "name": "launch", "id": h.index,
                           "pid": HOST_PID, "tid": HOST_TID, "ts": _us(h.end_s)})
    for t in prediction.step.ops:
        if not t.kernels:
            continue
        c = t.count
        events.append({
            "ph": "X", "cat": t.category, "name": t.op, "pid": DEVICE_PID, "tid": DEVICE_TID,
            "ts": _us(t.start_s), "dur": _us(t.kernel_s),
            "args": {
                "module": t.module, "phase": t.phase, "index": t.index, "kernels": t.kernels,
                "flops": c.flops, "bytes": c.bytes, "bound": t.kernel_bound,
                "idle_before_us": _us(t.idle_before_s),
            },
        })
        events.append({"ph": "f", "bp": "e", "cat": "dispatch", "name": "launch", "id": t.index,
                       "pid": DEVICE_PID, "tid": DEVICE_TID, "ts": _us(t.start_s)})
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "generator": "nnperf predict",
            "model": prediction.analysis.model,
            "gpu": gpu,
            "step_time_s": prediction.step.step_s,
            "note": "predicted timeline: times are model output, not measurements",
        },
    }


def write_chrome_trace(prediction: Prediction, path: str | Path) -> Path:
    """Write the trace as compact JSON (Perfetto reads it directly)."""
    path = Path(path)
    path.write_text(json.dumps(chrome_trace(prediction), separators=(",", ":")))
    return path
