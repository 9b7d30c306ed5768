"""``nnperf.stopping``: what a program started while the stop signals are held inherits."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from nnperf import stopping

pytestmark = [pytest.mark.process,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")]

#: Prints the signals this process blocks as its first statement, as a fork server's ``-c``
#: program starts.
PROBE = "print(next(line.split()[1] for line in open('/proc/self/status') if line.startswith('SigBlk:')))"


def _blocked_by_a_started_program() -> set[int]:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    mask = int(out.stdout, 16)
    return {n for n in range(1, 65) if mask >> (n - 1) & 1}


def test_a_program_started_inside_held_starts_with_the_stop_signals_blocked():
    assert not {signal.SIGINT, signal.SIGTERM} & _blocked_by_a_started_program()
    with stopping.held():
        assert {signal.SIGINT, signal.SIGTERM} <= _blocked_by_a_started_program()
    assert not {signal.SIGINT, signal.SIGTERM} & set(signal.pthread_sigmask(signal.SIG_BLOCK, ()))
