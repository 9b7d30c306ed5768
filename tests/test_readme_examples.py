"""The README's examples run as written: every ``nnperf`` and ``torchrun`` command of its shell
blocks (a block's commands in order, in one scratch folder, so ``plan -o plan.json`` feeds
``measure --layout plan.json``), and every Python block, each in a process of its own. A command
the README shows must exit 0; install lines (``pip``, ``ruff``, ``pytest``) are not run."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from nnperf.cli.app import cli

README = Path(__file__).resolve().parents[1] / "README.md"
_FENCE = re.compile(r"^( *)```(\w*)\n(.*?)^\1```", re.MULTILINE | re.DOTALL)
#: Commands that take more than a few seconds (searches over many traces, real runs).
_SLOW = ("nnperf fit", "nnperf advise", "nnperf plan", "torchrun")


def blocks(language: str) -> list[str]:
    """The README's fenced blocks in ``language``, dedented."""
    return [textwrap.dedent(body) for _, lang, body in _FENCE.findall(README.read_text()) if lang == language]


def commands(block: str) -> list[str]:
    """The ``nnperf``/``torchrun`` commands of a shell block, in order (``a && b`` is two)."""
    found = []
    for line in block.splitlines():
        for part in line.split(" #")[0].split("&&"):
            part = part.strip()
            if part.startswith(("nnperf ", "torchrun ")):
                found.append(part)
    return found


def runs(block: str) -> list[list[str]]:
    """What one test runs: a block that feeds a ``torchrun`` its files in one run, else each
    command on its own."""
    found = commands(block)
    if any(c.startswith("torchrun ") for c in found):
        return [found]
    return [[c] for c in found]


SHELL = [run for block in blocks("bash") for run in runs(block)]
PYTHON = blocks("python")


def _param(found: list[str]):  # type: ignore[no-untyped-def]
    marks = [pytest.mark.slow] if any(c.startswith(_SLOW) for c in found) else []
    return pytest.param(found, id=found[0][:70], marks=marks)


def test_the_readme_has_the_examples_this_test_runs():
    flat = [c for found in SHELL for c in found]
    assert "nnperf predict resnet50 --batch 64 --gpu h100 --amp bf16" in flat  # the set-up line
    assert any(c.startswith("torchrun ") and "--layout plan.json" in c for c in flat)
    assert len(PYTHON) >= 2


def _torchrun(command: str, cwd: Path) -> subprocess.CompletedProcess:
    """``torchrun ARGS`` as ``python -m torch.distributed.run ARGS``; on a timeout the whole
    process group goes (torchrun's workers would outlive it)."""
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone", *shlex.split(command)[1:]]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with subprocess.Popen(args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                          start_new_session=True) as process:
        try:
            out, err = process.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            raise
    return subprocess.CompletedProcess(args, process.returncode, out, err)


@pytest.mark.parametrize("found", [_param(found) for found in SHELL])
def test_shell_examples_run_as_written(found: list[str], tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for command in found:
        if command.startswith("torchrun "):
            done = _torchrun(command, tmp_path)
            assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"
            continue
        result = CliRunner().invoke(cli, shlex.split(command)[1:])
        assert result.exit_code == 0, f"{command}\n{result.output[-3000:]}"


@pytest.mark.parametrize("code", [pytest.param(code, id=code.splitlines()[0][:60]) for code in PYTHON])
def test_python_examples_run_as_written(code: str, tmp_path):
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr[-3000:]
