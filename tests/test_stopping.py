"""``nnperf.stopping``: what a program started while the stop signals are held inherits."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from nnperf import stopping

pytestmark = pytest.mark.process

#: Prints whether this process ignores SIGINT as its first statement (before any import that
#: Python itself does not need), as a fork server's ``-c`` program starts.
PROBE = "import signal; print(signal.getsignal(signal.SIGINT) == signal.SIG_IGN)"


def _started_program_ignores_sigint() -> bool:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    return out.stdout.strip() == "True"


@pytest.fixture
def hearing_ctrl_c():
    """Python's own SIGINT handler for the test: a suite started in the background of a
    non-interactive shell (as a CI script may start it) inherits SIGINT ignored."""
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, inherited)


def test_a_program_started_unheard_ignores_ctrl_c_from_its_start_and_the_parent_hears_it_after(hearing_ctrl_c):
    handler = signal.getsignal(signal.SIGINT)
    assert handler is signal.default_int_handler
    assert not _started_program_ignores_sigint()  # the default: a Python takes Ctrl-C at once
    with stopping.held(), stopping.unheard_by_children():
        assert _started_program_ignores_sigint()
    assert signal.getsignal(signal.SIGINT) is handler
