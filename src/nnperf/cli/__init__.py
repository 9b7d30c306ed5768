"""The ``nnperf`` command line. Each sub-command lives in its own module and registers here."""

from __future__ import annotations

from nnperf.cli.app import main

__all__ = ["main"]
