"""A console that does not squeeze wide tables when output goes to a file or a pipe."""

from __future__ import annotations

import sys

from rich.console import Console


def make_console() -> Console:
    return Console() if sys.stdout.isatty() else Console(width=220)
