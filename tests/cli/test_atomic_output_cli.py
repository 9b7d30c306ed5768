"""Output files are written atomically: an interrupted write leaves the old file or the new
one, never a torn or empty one in its place, and no temporary file behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from nnperf.cli.paths import write_output


def test_a_writer_that_fails_midway_leaves_the_old_content(tmp_path):
    out = tmp_path / "r.html"
    out.write_text("old report")

    def half(path):
        path.write_text("new rep")
        raise KeyboardInterrupt  # Ctrl-C in the middle of the write

    with pytest.raises(KeyboardInterrupt):
        write_output(out, "--output", half)
    assert out.read_text() == "old report"
    assert os.listdir(tmp_path) == ["r.html"]  # the temporary file is gone


def test_a_completed_write_replaces_the_file_and_keeps_its_permissions(tmp_path):
    out = tmp_path / "r.html"
    out.write_text("old")
    out.chmod(0o640)
    write_output(out, "--output", lambda p: p.write_text("new"))
    assert out.read_text() == "new"
    assert out.stat().st_mode & 0o777 == 0o640
    assert os.listdir(tmp_path) == ["r.html"]


def test_a_new_file_gets_the_umask_permissions(tmp_path):
    umask = os.umask(0o022)
    try:
        write_output(tmp_path / "n.json", "--trace-out", lambda p: p.write_text("{}"))
    finally:
        os.umask(umask)
    assert (tmp_path / "n.json").stat().st_mode & 0o777 == 0o644


WRITER = textwrap.dedent("""\
    import sys, time
    from nnperf import stopping
    stopping.take_stops()
    from nnperf.cli.paths import write_output

    def slow(path):
        with open(path, "w") as fh:
            for _ in range(400):
                fh.write("n" * 100_000)
                fh.flush()
                print("writing", flush=True)
                time.sleep(0.01)

    write_output(sys.argv[1], "--output", slow)
""")


def test_sigterm_while_writing_a_big_file_leaves_the_old_file(tmp_path):
    out = tmp_path / "trace.json"
    out.write_text("old trace")
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    proc = subprocess.Popen([sys.executable, str(script), str(out)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"  # the write has begun
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert out.read_text() == "old trace"  # not 0 bytes, not a torn prefix of the new one
    assert sorted(os.listdir(tmp_path)) == ["trace.json", "writer.py"]
