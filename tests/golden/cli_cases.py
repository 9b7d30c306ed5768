"""Golden files for every user-facing command's ``--json`` not covered by ``golden_cases``
(which holds analyze, predict, memory and fit of three models): advise, plan, compare, gemm
and gpus, each on a small workload, so that a changed answer is a reviewed change.

The files are ``data/cli_<command>.json``. A deliberate change of output (a fixed bug, a new
field, a timing model rebuilt) regenerates them in the same commit, where the diff shows what
moved:

    NNPERF_REGEN_GOLDEN=1 python -m pytest tests/golden/test_cli_golden.py

(or ``python tests/golden/cli_cases.py``). Left out: ``measure``, ``calibrate`` and ``bench``,
whose documents are measurements of this machine, and ``report``, which writes HTML.
"""

from __future__ import annotations

import os
from pathlib import Path

from golden_cases import stable

DATA = Path(__file__).parent / "data"
REGENERATE = "NNPERF_REGEN_GOLDEN"

#: command -> its arguments (``--json`` added): small workloads, seconds each.
CASES: dict[str, tuple[str, ...]] = {
    "advise": ("advise", "mlp", "-O", "widths=256,256", "--gpu", "h100", "--global-batch", "100000"),
    "plan": ("plan", "gpt2", "-O", "n_layer=2", "--seq", "128", "--batch", "2", "--amp", "bf16", "--gpu", "h100",
             "--gpus", "2"),
    "compare": ("compare", "gpt2", "-O", "n_layer=2", "--seq", "128", "--batch", "4", "--amp", "bf16",
                "--gpus", "v100,a100,h100,h200"),
    "gemm": ("gemm", "4096", "4096", "4095", "--gpu", "h100", "--dtype", "bf16"),
    "gpus": ("gpus", "h100"),
}


def argv(command: str) -> list[str]:
    return [*CASES[command], "--json"]


def path(command: str) -> Path:
    return DATA / f"cli_{command}.json"


def regenerating() -> bool:
    return os.environ.get(REGENERATE, "") not in ("", "0")


def run(command: str) -> str:
    """The command's JSON document as canonical text (wall-clock fields removed)."""
    from click.testing import CliRunner

    from nnperf.cli.app import cli

    result = CliRunner().invoke(cli, argv(command))
    assert result.exit_code == 0, result.output
    return stable(result.output)


if __name__ == "__main__":
    for name in CASES:
        path(name).write_text(run(name))
        print("wrote", path(name))
