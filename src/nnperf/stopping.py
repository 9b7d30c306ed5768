"""The signals that stop a command (Ctrl-C and ``kill``), held where a stop would leave a
half-made thing behind, handled where the main thread only waits, and raised again where the
exception they raised was lost.

The CLI turns SIGTERM into ``SystemExit(143)`` and Ctrl-C into ``KeyboardInterrupt`` (exit
130; ``take_stops``): both unwind, so ``finally`` blocks clean up (a half-written output file
is removed, worker processes are killed: ``search.fit_parallel.in_processes``). Three things
can get in the way:

- a stop while a pool starts its processes and threads leaves it half made (a thread waited
  for at exit that never started): ``held()`` defers the signals over such a block, and they
  are handled when it ends;
- before Python 3.12, a signal the kernel gives to a thread other than the main one (a
  progress line's, PyTorch's) sets the flag its Python handler waits on, but the main thread
  may not look at it for as long as it only waits (a Ctrl-C seen minutes later, or never).
  Threads started inside ``held()`` never take them, and a waiting loop calls
  ``handle_signals()`` to look;
- C code that imports a module and carries on when the import fails (an extension module's
  initialisation: triton's, which ``import torch._dynamo`` loads, on a CUDA build) discards
  whatever that import raised, the stop included: a signal handled inside it is lost and the command runs to its
  end. The stop is remembered, and ``check()`` raises it again where long work reports
  (``nnperf.progress``) or waits (``handle_signals``), before an output file is made
  (``cli.paths.atomic_path``, a calibration's files) and as a command returns.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import NoReturn

#: Ctrl-C and ``kill``'s default.
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}
_MASKS = hasattr(signal, "pthread_sigmask")  # POSIX

#: The stop signal this process was sent (``take_stops``), None before one comes.
_stop: int | None = None
#: The process that took the stops: a process forked from it dies of a stop signal instead.
_taker = os.getpid()


def take_stops() -> None:
    """From now on Ctrl-C raises ``KeyboardInterrupt`` and SIGTERM ``SystemExit(143)`` in this
    process, and ``check()`` raises the same again wherever it is called after one came. In
    a process forked from this one (before it sets its own handlers) a stop signal kills as
    it would have: such a child has no cleanup of its own to run."""
    global _taker
    _taker = os.getpid()
    for sig in STOP_SIGNALS:
        signal.signal(sig, _on_stop)


def check() -> None:
    """Raise the stop this process was sent, if one came: the exception its handler raised may
    have been discarded (the module docstring)."""
    if _stop is not None:
        _raise(_stop)


def _on_stop(signum: int, frame: FrameType | None) -> None:
    global _stop
    if os.getpid() != _taker:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    _stop = signum
    _raise(signum)


def _raise(signum: int) -> NoReturn:
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + signum)


@contextmanager
def held() -> Iterator[None]:
    """Defer the stop signals in this thread (and the threads and processes it starts: the
    mask survives ``fork`` and ``exec``) over the block; one that arrived meanwhile is
    handled as the block ends."""
    if not _MASKS:
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def release() -> None:
    """Take the stop signals again in a process started inside ``held()`` (a forked worker
    inherits the mask), with no stop of its own yet: one its parent was sent is the parent's to
    act on."""
    global _stop
    _stop = None
    if _MASKS:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def handle_signals() -> None:
    """Run the Python handlers of stop signals that arrived, now (CPython's
    ``signal.pthread_sigmask`` checks for pending signals after every call, whichever thread
    the kernel gave them to), and raise again a stop whose exception was lost (``check``)."""
    if _MASKS:
        signal.pthread_sigmask(signal.SIG_BLOCK, ())
    check()


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when the process that started it dies: a killed
    parent (SIGKILL, an out-of-memory kill, a stop that skipped the cleanup) must not leave
    workers or a fork server working on their own."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
    with contextlib.suppress(OSError, AttributeError):  # no prctl: the parent still kills them
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
