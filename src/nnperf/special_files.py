"""Paths that are not regular files: every command that writes output must write into them,
never rename a finished file onto them (that would replace ``/dev/null`` for the whole machine,
or a FIFO its reader is waiting on)."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def is_special(path: str | os.PathLike[str]) -> bool:
    """An existing path (followed through links) that is not a regular file or a folder: a
    device such as ``/dev/null``, a FIFO, a socket."""
    try:
        mode = os.stat(Path(path)).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))
