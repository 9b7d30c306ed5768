"""Per-op cost formulas. Importing this package registers every formula module."""

from __future__ import annotations

from nnperf.passes.costs import (  # noqa: F401  (registration side effects)
    amp,
    attention,
    communication,
    elementwise,
    embedding,
    factories,
    grouped,
    host,
    indexing,
    losses,
    matmul,
    memory,
    norms,
    optimizer,
    pooling,
    reductions,
    rnn,
    softmax,
)
from nnperf.passes.costs.custom import register_cost
from nnperf.passes.costs.registry import OpCost, lookup, registered_names
from nnperf.vocab import Category

__all__ = ["Category", "OpCost", "lookup", "register_cost", "registered_names"]
