"""Long commands stop when asked: Ctrl-C (SIGINT to the terminal's process group) or SIGTERM
(to nnperf alone, as ``kill`` and job schedulers send it) ends ``plan``, ``fit``, ``advise``
and ``calibrate`` with exit 130 or 143, leaves no worker process behind and no output file,
whole or partial. Each runs as a user runs it, with stderr on a terminal (a pseudo-terminal
here), so its progress line shows; the signal comes once that line says the work has begun
(and, for the searches that fork, as soon as a child process runs: on a CUDA build of PyTorch,
advise's first child is its fork server, so the signal often comes while it is spawned).

How long each took to stop is printed (``-s`` shows it), not asserted: on a loaded machine a
unit test must not fail for time. The wait has a generous limit only so that a hang fails
instead of blocking the suite.
"""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.process, pytest.mark.build, pytest.mark.skipif(not sys.platform.startswith("linux"),
                                                      reason="reads /proc and signals process groups")]

#: A limit for a hang, not a measure: the commands stop within a second or two.
HANG_S = 60
#: How long a command may take to reach the work the signal must interrupt (imports, a first
#: trace, on a loaded 2-core machine).
START_S = 240


def _session_processes(sid: int) -> list[tuple[int, str]]:
    """The live processes of session ``sid`` (the command and everything it started)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp session ...: comm may hold spaces, so split after ")"
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[3]) == sid and fields[0] != "Z":
            found.append((int(entry.name), stat[stat.index("(") + 1:stat.rindex(")")]))
    return found


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _as_from_a_shell() -> None:
    """In the child before it runs nnperf: Ctrl-C and SIGTERM as a shell leaves them to a
    command it starts (pytest-xdist's workers ignore SIGINT, and a child inherits that)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


def _run_and_stop(args: list[str], tmp_path: Path, sig: int, ready: str, *, workers: bool,
                  env: dict[str, str] | None = None) -> tuple[int, str, float]:
    """Start ``nnperf ARGS`` with stderr on a terminal, wait until its terminal shows
    ``ready`` (and, with ``workers``, until it has child processes), send ``sig`` as a user
    would; its exit code, what its terminal showed, and the seconds it took to stop."""
    primary, secondary = pty.openpty()
    environment = {**os.environ, "TERM": "xterm", "COLUMNS": "160", **(env or {})}
    proc = subprocess.Popen([sys.executable, "-m", "nnperf", *args], cwd=tmp_path, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=secondary, start_new_session=True,
                            env=environment, preexec_fn=_as_from_a_shell)
    os.close(secondary)
    shown = b""
    deadline = time.monotonic() + START_S
    try:
        while time.monotonic() < deadline:
            if select.select([primary], [], [], 0.2)[0]:
                try:
                    shown += os.read(primary, 65536)
                except OSError:  # the command ended: its terminal closed
                    break
            if proc.poll() is not None:
                break
            if ready.encode() in shown and (not workers or _children(proc.pid)):
                break
        assert proc.poll() is None, f"ended before the signal: {shown.decode(errors='replace')[-2000:]}"
        assert ready.encode() in shown, f"no {ready!r} on its terminal: {shown.decode(errors='replace')[-2000:]}"
        if workers:
            assert _children(proc.pid), "no worker process started"
        sent = time.monotonic()
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)  # Ctrl-C: the terminal signals the whole foreground group
        else:
            os.kill(proc.pid, sig)
        # read its terminal meanwhile, as a terminal does: a command whose progress line fills
        # an unread pseudo-terminal blocks writing it and cannot end
        while proc.poll() is None and time.monotonic() - sent < HANG_S:
            if select.select([primary], [], [], 0.05)[0]:
                try:
                    shown += os.read(primary, 65536)
                except OSError:
                    break
        code = proc.wait(timeout=HANG_S)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        os.close(primary)
    left = _session_processes(proc.pid)
    for _ in range(50):  # a fork server notices its parent's end on its next read
        if not left:
            break
        time.sleep(0.2)
        left = _session_processes(proc.pid)
    assert not left, f"processes left behind: {left}"
    print(f"{' '.join(args[:1])} {signal.Signals(sig).name}: stopped {took:.2f} s after the signal")
    return code, shown.decode(errors="replace"), took


def _expected(sig: int) -> int:
    return 128 + sig  # 130 for SIGINT, 143 for SIGTERM


SIGNALS = [pytest.param(signal.SIGINT, id="ctrl-c"), pytest.param(signal.SIGTERM, id="sigterm")]


@pytest.mark.parametrize("sig", SIGNALS)
def test_plan_of_a_1024_gpu_search_stops_with_its_workers(sig, tmp_path):
    code, shown, _ = _run_and_stop(["plan", "llama-7b", "--gpu", "h100", "--gpus", "1024"], tmp_path, sig,
                                   "layout groups searched", workers=True, env={"NNPERF_PLAN_WORKERS": "2"})
    assert code == _expected(sig), shown[-2000:]
    assert "Traceback" not in shown
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("sig", SIGNALS)
def test_fit_stops_with_its_workers(sig, tmp_path):
    code, shown, _ = _run_and_stop(["fit", "gpt2", "--gpu", "h100"], tmp_path, sig, "tracing batch",
                                   workers=True, env={"NNPERF_FIT_WORKERS": "2"})
    assert code == _expected(sig), shown[-2000:]
    assert "Traceback" not in shown
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("sig", SIGNALS)
def test_advise_stops_and_writes_no_report(sig, tmp_path):
    code, shown, _ = _run_and_stop(["advise", "gpt2", "--gpu", "h100", "--html", "advice.html"], tmp_path, sig,
                                   "tracing the step as given", workers=True, env={"NNPERF_FIT_WORKERS": "2"})
    assert code == _expected(sig), shown[-2000:]
    assert "Traceback" not in shown
    assert list(tmp_path.iterdir()) == []  # neither the report nor a temporary file of it


@pytest.mark.parametrize("sig", SIGNALS)
def test_calibrate_stops_and_writes_no_profile(sig, tmp_path):
    code, shown, _ = _run_and_stop(["calibrate", "--device", "cpu", "-o", "cpu.toml"], tmp_path, sig, "gemm",
                                   workers=False)
    assert code == _expected(sig), shown[-2000:]
    assert "Traceback" not in shown
    assert list(tmp_path.iterdir()) == []
