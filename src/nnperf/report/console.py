"""The console tables print to: the terminal's width, COLUMNS when set, else wide.

When output goes to a file or a pipe there is no terminal to measure; a wide default keeps
tables from being squeezed into wrapped cells there. COLUMNS, when set, is the user saying
how wide the output should be, and wins (``COLUMNS=100 nnperf predict ... | less``).
"""

from __future__ import annotations

import os
import sys

from rich.console import Console

#: Width when output is not a terminal and COLUMNS is not set.
WIDE = 220


def output_width() -> int | None:
    """COLUMNS when it is a positive integer, else WIDE off a terminal (None: measure it)."""
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    return None if sys.stdout.isatty() else WIDE


def make_console() -> Console:
    return Console(width=output_width())
