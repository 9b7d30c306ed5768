"""``MemoryReport``: the one form shared by predicted and measured memory.

A prediction (from a trace) and a measurement (from ``torch.cuda.memory_stats`` on a real
GPU) fill the same fields, so a later ``nnperf measure`` and the validation code can print
them side by side and compute errors field by field. Fields a source cannot know stay
``None`` (a measurement has no per-module breakdown; a prediction has no measured total).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from nnperf.errors import UsageError
from nnperf.vocab import MemoryCategory

SCHEMA = "nnperf.memory/1"

#: Breakdown categories (``MemoryCategory``), in the order tables print them. Every byte of
#: the replayed trace falls in exactly one of them, so they add up to the requested bytes at
#: the peak.
CATEGORIES = tuple(MemoryCategory)

CATEGORY_LABELS = {
    MemoryCategory.PARAMETERS: "parameters",
    MemoryCategory.BUFFERS: "buffers (e.g. batch-norm statistics)",
    MemoryCategory.INPUTS: "input batch",
    MemoryCategory.GRADIENTS: "gradients",
    MemoryCategory.OPTIMIZER_STATE: "optimizer state",
    MemoryCategory.AMP_WEIGHT_CASTS: "weight copies (autocast casts, FSDP's gathered parameters)",
    MemoryCategory.SAVED_ACTIVATIONS: "activations kept for backward",
    MemoryCategory.FORWARD_TEMPORARIES: "forward temporaries",
    MemoryCategory.BACKWARD_TEMPORARIES: "backward temporaries (activation gradients)",
    MemoryCategory.OPTIMIZER_TEMPORARIES: "optimizer temporaries (foreach outputs)",
    MemoryCategory.WORKSPACES: "cuBLAS workspaces",
}


def category_label(key: str) -> str:
    """A breakdown key as tables print it ('optimizer state'); unknown keys de-snaked."""
    return CATEGORY_LABELS.get(key, key.replace("_", " "))


@dataclass
class TimelinePoint:
    """Allocated (and simulated reserved) bytes right after one event's outputs are allocated."""

    index: int
    phase: str
    module: str
    allocated: int
    reserved: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class MemoryReport:
    """Peak device memory of one step and where it goes.

    ``peak_allocated``: what ``torch.cuda.max_memory_allocated()`` reports (blocks, rounded).
    ``peak_reserved``: what ``torch.cuda.max_memory_reserved()`` reports (allocator segments).
    ``device_total``: what ``nvidia-smi`` would show for the process: reserved plus the CUDA
    context and memory outside the caching allocator; ``device_terms`` says what was added.
    """

    source: str  # "predicted" | "measured"
    model: str
    config: dict[str, Any] = field(default_factory=dict)
    peak_allocated: int | None = None
    peak_reserved: int | None = None
    device_total: int | None = None
    peak_requested: int | None = None  # bytes of tensors (before allocator rounding) at the peak
    peak_event: int | None = None
    peak_phase: str | None = None
    peak_module: str | None = None
    breakdown: dict[str, int] = field(default_factory=dict)  # category -> bytes at the peak
    device_terms: dict[str, int] = field(default_factory=dict)  # label -> bytes outside allocated
    saved_activations: dict[str, int] = field(default_factory=dict)  # module -> bytes
    model_states: dict[str, int] = field(default_factory=dict)  # parameters, gradients, ... bytes
    timeline: list[TimelinePoint] = field(default_factory=list)
    timeline_events: int = 0  # events in the full timeline (before down-sampling)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["schema"] = SCHEMA
        doc["timeline"] = [p.to_json() for p in self.timeline]
        # the names the analysis JSON documents for this section
        doc["peak_reserved_estimate"] = self.peak_reserved
        doc["device_total_estimate"] = self.device_total
        return doc

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> MemoryReport:
        """Read a report written by ``to_json`` or a hand-written measurement file."""
        known = {f for f in cls.__dataclass_fields__}
        kwargs = {k: v for k, v in doc.items() if k in known}
        kwargs["timeline"] = [TimelinePoint(**p) for p in doc.get("timeline", [])]
        kwargs.setdefault("source", "measured")
        kwargs.setdefault("model", "?")
        return cls(**kwargs)


@dataclass
class Comparison:
    """Predicted vs measured for one quantity; ``error`` is (predicted - measured) / measured."""

    quantity: str
    predicted: int | None
    measured: int | None

    @property
    def error(self) -> float | None:
        if self.predicted is None or not self.measured:
            return None
        return (self.predicted - self.measured) / self.measured


def compare(predicted: MemoryReport, measured: MemoryReport) -> list[Comparison]:
    """Side-by-side peaks, so the 5% bar of issue #4 can be checked once measurements exist."""
    return [
        Comparison(q, getattr(predicted, q), getattr(measured, q))
        for q in ("peak_allocated", "peak_reserved", "device_total")
    ]


def load_measurements(path: str | Path) -> list[MemoryReport]:
    """Measured peaks from a JSON file: one report object or a list of them.

    Expected fields per entry: ``model``, ``config`` (at least ``batch``, ``mode``; whatever
    else was set: ``dtype``, ``amp``, ``optimizer``), and any of ``peak_allocated``,
    ``peak_reserved``, ``device_total`` in bytes, as ``torch.cuda.max_memory_allocated()``,
    ``torch.cuda.max_memory_reserved()`` and ``nvidia-smi`` reported them.
    """
    doc = json.loads(Path(path).read_text())
    entries = doc if isinstance(doc, list) else doc.get("measurements", [doc])
    reports = [MemoryReport.from_json({"source": "measured", **e}) for e in entries if isinstance(e, dict)]
    if not reports or all(r.peak_allocated is None and r.peak_reserved is None and r.device_total is None
                          for r in reports):
        raise UsageError(
            f"{path} holds no measured peak memory: expected entries with 'model', 'config' "
            "and any of 'peak_allocated', 'peak_reserved', 'device_total' (bytes)"
        )
    return reports
