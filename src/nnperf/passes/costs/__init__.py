"""Per-op cost formulas. Importing this package registers every formula module."""

from __future__ import annotations

from nnperf.passes.costs import attention, matmul  # noqa: F401  (registration side effects)
from nnperf.passes.costs.registry import OpCost, lookup, registered_names

__all__ = ["OpCost", "lookup", "registered_names"]
