"""Every output option behaves the same: a path that cannot be written, or whose folder does
not exist (a typo would otherwise make a new tree silently), is one line and exit 2, found
before the command does its work."""

from __future__ import annotations

import errno
import json
import os

import pytest
from click.testing import CliRunner

from nnperf.cli.app import cli
from nnperf.cli.paths import write_output
from nnperf.errors import UsageError

MODEL = ["mlp", "--batch", "4", "-O", "widths=8,16,4"]


def invoke(*args: str):
    result = CliRunner().invoke(cli, list(args))
    return result, result.output


def _one_line(out: str) -> str:
    assert "Traceback" not in out, out
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1, out
    return lines[0]


def test_report_writes_into_existing_folders(tmp_path):
    (tmp_path / "a").mkdir()
    html, png, svg = tmp_path / "a" / "r.html", tmp_path / "r.png", tmp_path / "a" / "r.svg"
    result, out = invoke("report", *MODEL, "--gpu", "h100", "-o", str(html), "--png", str(png),
                         "--svg", str(svg))
    assert result.exit_code == 0, out
    assert html.read_text().startswith("<!DOCTYPE html>")
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert svg.read_text().lstrip().startswith("<?xml")


@pytest.mark.parametrize("option", ["-o", "--png", "--svg"])
def test_report_refuses_a_missing_folder_and_creates_nothing(tmp_path, option):
    target = tmp_path / "typo" / "dir" / "r.out"
    result, out = invoke("report", *MODEL, "--gpu", "h100", option, str(target))
    assert result.exit_code == 2, out
    assert _one_line(out) == (f"nnperf: error: cannot write {'--output' if option == '-o' else option} "
                              f"'{target}': the folder '{tmp_path / 'typo' / 'dir'}' does not exist; "
                              "create it first (nnperf does not make folders)")
    assert not (tmp_path / "typo").exists()


@pytest.mark.parametrize("option", ["-o", "--png", "--svg"])
def test_report_path_below_a_file_is_a_usage_error(tmp_path, option):
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a folder")
    target = blocker / "r.out"
    result, out = invoke("report", *MODEL, option, str(target))
    assert result.exit_code == 2, out
    line = _one_line(out)
    assert str(target) in line and "is a file, not a directory" in line


def test_report_to_a_directory_is_a_usage_error(tmp_path):
    result, out = invoke("report", *MODEL, "-o", str(tmp_path))
    assert result.exit_code == 2, out
    assert "Traceback" not in out and "directory" in out


def test_measure_trace_out_writes_into_an_existing_folder(tmp_path):
    path = tmp_path / "t.json"
    result, out = invoke("measure", *MODEL, "--device", "cpu", "--steps", "1", "--warmup", "0",
                         "--json", "--trace-out", str(path))
    assert result.exit_code == 0, out
    assert "traceEvents" in json.loads(path.read_text())


@pytest.mark.parametrize("command", ["predict", "measure", "advise", "calibrate"])
def test_every_output_option_refuses_a_missing_folder(tmp_path, command):
    path = str(tmp_path / "new" / "t.json")
    option, args = {
        "predict": ("--trace-out", [*MODEL, "--trace-out", path]),
        "measure": ("--trace-out", [*MODEL, "--device", "cpu", "--trace-out", path]),
        "advise": ("--html", [*MODEL, "--html", path]),
        "calibrate": ("--output", ["--device", "cpu", "--quick", "-o", path]),
    }[command]
    result, out = invoke(command, *args)
    assert result.exit_code == 2, out
    line = _one_line(out)
    assert line.startswith(f"nnperf: error: cannot write {option} ") and f"'{tmp_path / 'new'}' does not exist" in line
    assert not (tmp_path / "new").exists()


def test_measure_trace_out_below_a_file_fails_before_measuring(tmp_path):
    blocker = tmp_path / "file.txt"
    blocker.write_text("")
    result, out = invoke("measure", *MODEL, "--device", "cpu", "--trace-out",
                         str(blocker / "t.json"))
    assert result.exit_code == 2, out
    assert "--trace-out" in _one_line(out)


@pytest.mark.parametrize("option", ["-o", "--device-file"])
def test_calibrate_checks_its_outputs_before_measuring(tmp_path, option):
    blocker = tmp_path / "file.txt"
    blocker.write_text("")
    args = ["calibrate", "--device", "cpu", "--quick"]
    if option == "-o":
        args += ["-o", str(blocker / "p.toml")]
    else:
        args += ["-o", str(tmp_path / "p.toml"), "--device-file", str(blocker / "d.toml")]
    result, out = invoke(*args)
    assert result.exit_code == 2, out
    assert "is a file, not a directory" in _one_line(out)


def test_predict_trace_out_writes_the_file(tmp_path):
    path = tmp_path / "t.json"
    result, out = invoke("predict", *MODEL, "--gpu", "h100", "--trace-out", str(path))
    assert result.exit_code == 0, out
    assert path.is_file()


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0,
                    reason="root may write anywhere")
def test_a_folder_without_write_permission_is_a_usage_error(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        result, out = invoke("report", *MODEL, "-o", str(locked / "r.html"))
    finally:
        locked.chmod(0o755)
    assert result.exit_code == 2, out
    assert "no permission to write" in _one_line(out)


def test_a_failed_write_is_a_usage_error_naming_the_option(tmp_path):
    def disk_full(path):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    with pytest.raises(UsageError, match=r"cannot write --output '.*r\.html': no space left"):
        write_output(tmp_path / "r.html", "--output", disk_full)
    assert list(tmp_path.iterdir()) == []  # the temporary file is gone


def test_a_fifo_is_written_into_not_replaced(tmp_path):
    """``-o /dev/stdout`` or a named pipe: renaming a finished file onto it would replace the
    device or FIFO (for the whole machine, as root, for /dev/null); the content goes into it."""
    import stat
    import threading

    fifo = tmp_path / "pipe.html"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    write_output(fifo, "--output", lambda p: p.write_text("<html>hello</html>"))
    reader.join(timeout=10)
    assert received == [b"<html>hello</html>"]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe.html"]  # no temporary left
