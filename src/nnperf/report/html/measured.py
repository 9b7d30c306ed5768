"""Reading a measured run (``nnperf measure --json``) for the report's overlay.

``nnperf measure --json`` writes predict's JSON with measured values beside the predicted
ones (``totals.measured_step_time_s``, ``modules[].measured_time_s``,
``totals.measured_peak_memory_bytes``, ``measurement.device_name``); a hand-written file may
use the plain names below instead. The reader takes whichever is there and ignores the rest. Everything is optional; the report shows "not measured"
where a field is missing instead of failing.

Accepted shapes (all keys optional):

    {"totals": {"step_time_s": 0.25} | "step_time_s": 0.25,
     "gpu": "H100 SXM5 80GB" | {"name": ...},
     "modules": [{"name": "h.0", "time_s": 0.004}, ...]  |  {"h.0": 0.004, ...},
     "memory": {"peak_allocated": ..., "peak_reserved": ..., "timeline": [{"index", "allocated"}]}}
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nnperf.errors import UsageError


@dataclass
class Measured:
    """The parts of a measured run the report overlays on the prediction."""

    source: str
    gpu: str | None = None
    gpu_id: str | None = None  # the catalog id of ``gpu``, resolved once when read (None: unknown)
    device: str | None = None  # "cuda", "cuda:0", "cpu" when the file says
    step_time_s: float | None = None
    module_time_s: dict[str, float] = field(default_factory=dict)
    peak_allocated: float | None = None
    peak_reserved: float | None = None
    memory_timeline: list[tuple[int, float]] = field(default_factory=list)  # (event index, bytes)

    def module_time(self, key: str) -> float | None:
        return self.module_time_s.get(key)

    def matches(self, gpu: Any) -> bool:
        """Whether this is a measurement of ``gpu`` (a resolved GPU): by catalog id, or by
        name for a device the catalog does not know; a file naming no device matches."""
        if self.gpu is None or self.gpu in (gpu.name, gpu.id):
            return True
        return self.gpu_id == gpu.id


def catalog_id(name: str) -> str | None:
    """The catalog id of a device name ('NVIDIA H100 80GB HBM3' -> 'h100-sxm'), or None for a
    device the catalog does not know: the one GPU lookup of a measurement, done on reading."""
    from nnperf.errors import NnperfError
    from nnperf.hardware import load_gpu

    try:
        return load_gpu(name).id
    except NnperfError:
        return None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def measured_from_json(doc: dict[str, Any], source: str = "measurement") -> Measured:
    """Pick the overlay fields out of a measurement document (see the module docstring)."""
    if not isinstance(doc, dict):
        raise UsageError(f"{source}: expected a JSON object from 'nnperf measure --json'")
    totals = doc.get("totals") if isinstance(doc.get("totals"), dict) else {}
    measurement = doc.get("measurement") if isinstance(doc.get("measurement"), dict) else {}
    # 'nnperf measure --json' writes predict's document with measured_* fields beside the
    # predicted ones: there, plain 'step_time_s' / 'time_s' are predictions and must not be read
    combined = "measured_step_time_s" in totals or bool(measurement)
    if combined:
        step = _number(totals.get("measured_step_time_s"))
    else:
        step = _number(totals.get("step_time_s", doc.get("step_time_s")))
    gpu = measurement.get("device_name") or doc.get("gpu")
    if isinstance(gpu, dict):
        gpu = gpu.get("name") or gpu.get("id")
    modules: dict[str, float] = {}
    raw = doc.get("modules")
    if isinstance(raw, dict):
        modules = {str(k): float(v) for k, v in raw.items() if _number(v) is not None}
    elif isinstance(raw, list):
        for row in raw:
            if isinstance(row, dict) and "name" in row:
                t = _number(row.get("measured_time_s") if combined else row.get("time_s", row.get("measured_time_s")))
                if t:
                    modules[str(row["name"])] = t
    modules.pop("", None)  # the root's time is the whole step, not the ops it runs itself
    mem = doc.get("memory") if isinstance(doc.get("memory"), dict) else {}
    if combined and "peak_allocated" not in mem:
        mem = {**mem, "peak_allocated": totals.get("measured_peak_memory_bytes")}
    timeline = []
    for p in mem.get("timeline", []) or []:
        if isinstance(p, dict) and _number(p.get("allocated")) is not None and _number(p.get("index")) is not None:
            timeline.append((int(p["index"]), float(p["allocated"])))
    measured = Measured(
        source=source,
        gpu=str(gpu) if gpu else None,
        gpu_id=catalog_id(str(gpu)) if gpu else None,
        device=str(measurement["device"]) if measurement.get("device") else None,
        step_time_s=step,
        module_time_s=modules,
        peak_allocated=_number(mem.get("peak_allocated", doc.get("peak_allocated"))),
        peak_reserved=_number(mem.get("peak_reserved", doc.get("peak_reserved"))),
        memory_timeline=timeline,
    )
    if step is None and not modules and measured.peak_allocated is None:
        raise UsageError(
            f"{source} holds no measured values (no measured step time, module times or peak "
            "memory): give the JSON of 'nnperf measure --json'"
        )
    return measured


def check_comparable(measured: Measured, gpus: list[Any]) -> None:
    """A measurement overlays a prediction only for the same kind of device: a CPU run, or a
    run on a GPU none of the predicted ones is, beside GPU predictions would print errors
    that mean nothing."""
    names = ", ".join(g.name for g in gpus)
    if measured.device and measured.device.startswith("cpu"):
        raise UsageError(
            f"{measured.source} was measured on the CPU ({measured.gpu or 'cpu'}), the report "
            f"predicts {names}: overlay a measurement from that GPU"
        )
    if measured.gpu and measured.gpu_id is not None and not any(measured.matches(g) for g in gpus):
        raise UsageError(
            f"{measured.source} was measured on {measured.gpu}, the report predicts {names}: "
            "predict that GPU (--gpu) or overlay a measurement from a predicted one"
        )


def load_measured(path: str | Path) -> Measured:
    """Read ``path`` (a ``nnperf measure --json`` file) into the overlay form."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"measurement file '{path}' does not exist") from None
    except json.JSONDecodeError as err:
        raise UsageError(f"measurement file '{path}' is not valid JSON: {err}") from None
    return measured_from_json(doc, source=path.name)
