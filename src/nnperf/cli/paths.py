"""Output files the commands write (reports, images, Chrome traces, profiles): one behaviour
for all of them.

Every file is written atomically: to a temporary name in the same folder, renamed into place
(``os.replace``) only when complete, the temporary file removed on any failure. A run killed
mid-write (Ctrl-C, SIGTERM: ``nnperf.cli.app.main`` turns it into an exit that unwinds) leaves
the old file or the new one, never a torn or empty one in its place.

A path that is not a regular file (``/dev/null``, ``/dev/stdout``, a FIFO a reader waits on)
is not replaced: the complete output is copied into it (``is_special``).

A missing parent directory is refused, not created: a typo in the folder part of a path
(``-o /nonexist/dir/r.html``) would otherwise make a new tree silently. That, and a path that
cannot be written (no permission, a directory where the file should go, a file where a
directory should be), is a usage error naming the option, found before the command spends
seconds or minutes tracing, measuring or calibrating: ``check_output`` looks without touching
anything, ``write_output`` writes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TypeVar

from nnperf import stopping
from nnperf.errors import UsageError, shown
from nnperf.special_files import is_special

T = TypeVar("T")


def check_output(value: str | os.PathLike[str], option: str) -> Path:
    """The path of an output option, checked before the work: it is not a directory, and its
    folder exists and is a directory this process may write in.

    Changes nothing on disk (a command that fails later must not leave folders behind).
    """
    path = Path(value).expanduser()
    try:
        if path.is_dir():
            raise UsageError(f"{option} '{value}' is a directory; give a file path inside it")
        if path.exists() and not os.access(path, os.W_OK):
            raise UsageError(f"cannot write {option} '{value}': the file is read-only")
        parent = folder = path.absolute().parent
        while not folder.exists():
            folder = folder.parent
    except OSError as err:  # e.g. a folder on the way that may not be searched
        raise UsageError(f"cannot write {option} '{value}': {_reason(err)}") from None
    if not folder.is_dir():
        raise UsageError(f"cannot write {option} '{value}': '{folder}' is a file, not a directory")
    if folder != parent:
        raise UsageError(f"cannot write {option} '{value}': the folder '{path.parent}' does not "
                         "exist; create it first (nnperf does not make folders)")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write {option} '{value}': no permission to write in '{folder}'")
    return path


def write_output(path: str | os.PathLike[str], option: str, write: Callable[[Path], T]) -> T:
    """``write(tmp)`` to a temporary file beside ``path`` and rename that onto ``path`` (see
    the module docstring); an ``OSError`` (a race with ``check_output``, a full disk, a
    missing folder) becomes a usage error naming the option and the path instead of a
    traceback. ``write`` gets the temporary path, which ends with the
    same suffix as ``path`` (writers that choose a format by suffix still do)."""
    with os_errors_as_usage(option, path), atomic_path(path) as tmp:
        return write(tmp)


@contextlib.contextmanager
def os_errors_as_usage(option: str, path: str | os.PathLike[str]) -> Iterator[None]:
    """An ``OSError`` in the block becomes a usage error naming ``option`` and ``path``: for a
    writer that is atomic on its own (calibration writes several files, renamed together)."""
    try:
        yield
    except OSError as err:
        raise UsageError(f"cannot write {option} {shown(os.fspath(path))}: {_reason(err)}") from None


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path in ``path``'s folder (which must exist) that becomes ``path`` when the
    block ends normally; on any exception, KeyboardInterrupt and SystemExit included, it is
    removed and ``path`` is left as it was. A symbolic link is written through, not replaced.
    The new file gets the old file's permissions, or the usual ones (0666 less the umask).
    A device or FIFO (``is_special``) gets the finished content written into it instead.
    Nothing is made after a stop signal came, even one whose exception was lost
    (``stopping.check``)."""
    target = Path(path).expanduser()
    if is_special(target):
        with tempfile.TemporaryDirectory() as folder:
            tmp = Path(folder) / f"output{target.suffix}"
            yield tmp
            stopping.check()
            with open(tmp, "rb") as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
        return
    if target.is_symlink():
        target = target.resolve()
    fd, name = tempfile.mkstemp(prefix=f".{target.name[:100]}.", suffix=f".partial{target.suffix}",
                                dir=target.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        stopping.check()
        os.chmod(tmp, _mode_for(target))
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _mode_for(target: Path) -> int:
    """The permissions the written file should have: those of the file it replaces, else
    what ``open()`` would give a new file (mkstemp makes it 0600)."""
    try:
        return target.stat().st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def distinct_outputs(outputs: Mapping[str, Path]) -> None:
    """Two output options naming one file would write it twice, the second over the first."""
    seen: dict[Path, str] = {}
    for option, path in outputs.items():
        key = path.absolute()
        if key in seen:
            raise UsageError(f"{seen[key]} and {option} both name '{path}'; give each its own file")
        seen[key] = option


def _reason(err: OSError) -> str:
    """``Permission denied: '/x'`` -> ``permission denied ('/x')``: the OS's words, one line."""
    text = (err.strerror or str(err)).strip()
    text = text[:1].lower() + text[1:]
    return f"{text} ({shown(err.filename)})" if err.filename else text
