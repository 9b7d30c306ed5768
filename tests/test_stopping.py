"""``nnperf.stopping``: what a program started while the stop signals are held inherits, and a
stop whose exception was discarded still stops the work."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

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


#: A process that takes the stops and is sent one where the exception its handler raises is
#: discarded: in a ``__del__`` (Python prints it as ignored), as C code that imports a module
#: discards an import's (``import torch._dynamo`` importing triton). It then goes on to
#: ``NEXT``.
LOST_STOP = textwrap.dedent("""\
    import os, signal, sys
    from nnperf import progress, stopping
    from nnperf.cli.paths import write_output

    stopping.take_stops()

    class SignalledWhileCollected:
        def __del__(self):
            os.kill(os.getpid(), signal.{signal})
            for _ in range(1000):  # the handler runs between two of these steps
                pass

    SignalledWhileCollected()
    print("ran on", flush=True)
    {next}
    print("not stopped", flush=True)
""")
#: What the process does next, and the lines it prints before it stops.
NEXT = {"a progress report": ("progress.note('the next search')", ["ran on"]),
        "an output file": ("write_output(sys.argv[1], '--html', lambda path: path.write_text('report'))", ["ran on"]),
        "a wait for workers": ("stopping.handle_signals()", ["ran on"]),
        # a worker forked now leaves the stop to its parent: its own reports go on
        "a worker's report, then its parent's": (
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    stopping.release()\n"
            "    progress.note('a search in a worker')\n"
            "    os._exit(0)\n"
            "print('worker', os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)\n"
            "progress.note('the next search')", ["ran on", "worker 0"])}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
@pytest.mark.parametrize("where", NEXT)
def test_a_stop_whose_exception_was_discarded_stops_at_the_next_report_or_output(where, sig, tmp_path):
    code, printed = NEXT[where]
    script = LOST_STOP.format(signal=sig.name, next=code)
    output = tmp_path / "report.html"
    done = subprocess.run([sys.executable, "-c", script, str(output)], capture_output=True, text=True, timeout=120)
    assert done.stdout.splitlines() == printed, done.stderr  # lost once, then stopped
    if sig == signal.SIGTERM:
        assert done.returncode == 143, done.stderr
    else:  # an uncaught KeyboardInterrupt: Python ends by the signal, as a shell expects
        assert done.returncode == -signal.SIGINT, done.stderr
        assert "KeyboardInterrupt" in done.stderr
    assert not output.exists()
    assert [p.name for p in tmp_path.iterdir()] == []  # and no partial file beside it
