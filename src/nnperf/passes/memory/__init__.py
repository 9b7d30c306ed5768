"""The memory model: peak device memory of a step, its breakdown and timeline (issue #4).

``predict_memory(trace)`` replays a trace's tensor lifetimes through a simulation of the
CUDA caching allocator; ``MemoryReport`` is the form predictions and measurements share.
"""

from __future__ import annotations

from nnperf.passes.memory.allocator import CachingAllocator, round_size, segment_size
from nnperf.passes.memory.model import classify, predict_memory
from nnperf.passes.memory.report import (
    CATEGORIES,
    CATEGORY_LABELS,
    Comparison,
    MemoryReport,
    TimelinePoint,
    compare,
    load_measurements,
)

__all__ = [
    "CATEGORIES",
    "CATEGORY_LABELS",
    "CachingAllocator",
    "Comparison",
    "MemoryReport",
    "TimelinePoint",
    "classify",
    "compare",
    "load_measurements",
    "predict_memory",
    "round_size",
    "segment_size",
]
