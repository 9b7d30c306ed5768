"""nnperf: how fast and how big a PyTorch network will be on a GPU, and why."""

from __future__ import annotations

__version__ = "0.1.0"
