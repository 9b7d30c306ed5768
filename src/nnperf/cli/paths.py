"""Output files the commands write (reports, images, Chrome traces, profiles): one behaviour
for all of them.

A missing parent directory is created, as ``calibrate`` always did, so ``-o out/r.html``
works in a fresh checkout. A path that still cannot be written (no permission, a directory
where the file should go, a file where a directory should be) is a usage error naming the
option, and it is found before the command spends seconds or minutes tracing, measuring or
calibrating: ``check_output`` looks without touching anything, ``write_output`` creates the
parents and writes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from nnperf.errors import UsageError

T = TypeVar("T")


def check_output(value: str | os.PathLike[str], option: str) -> Path:
    """The path of an output option, checked before the work: it is not a directory, and the
    nearest folder that exists on its way is a directory this process may write in.

    Changes nothing on disk (a command that fails later must not leave folders behind).
    """
    path = Path(value).expanduser()
    try:
        if path.is_dir():
            raise UsageError(f"{option} '{value}' is a directory; give a file path inside it")
        if path.exists() and not os.access(path, os.W_OK):
            raise UsageError(f"cannot write {option} '{value}': the file is read-only")
        folder = path.absolute().parent
        while not folder.exists():
            folder = folder.parent
    except OSError as err:  # e.g. a folder on the way that may not be searched
        raise UsageError(f"cannot write {option} '{value}': {_reason(err)}") from None
    if not folder.is_dir():
        raise UsageError(f"cannot write {option} '{value}': '{folder}' is a file, not a directory")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write {option} '{value}': no permission to write in '{folder}'")
    return path


def write_output(path: str | os.PathLike[str], option: str, write: Callable[[Path], T]) -> T:
    """Create the missing parent directories of ``path``, then ``write(path)``; an ``OSError``
    from either (a race with ``check_output``, a full disk) becomes a usage error naming the
    option and the path instead of a traceback."""
    target = Path(path).expanduser()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        return write(target)
    except OSError as err:
        raise UsageError(f"cannot write {option} '{path}': {_reason(err)}") from None


def _reason(err: OSError) -> str:
    """``Permission denied: '/x'`` -> ``permission denied ('/x')``: the OS's words, one line."""
    text = (err.strerror or str(err)).strip()
    text = text[:1].lower() + text[1:]
    return f"{text} ('{err.filename}')" if err.filename else text


def prepare_output(value: str | os.PathLike[str], option: str) -> Path:
    """``check_output``, then create the missing parent directories: for an output that
    another component opens itself later (the profiler's Chrome trace)."""
    path = check_output(value, option)
    return write_output(path, option, lambda p: p)
