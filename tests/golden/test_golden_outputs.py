"""analyze/predict/memory/fit --json of three zoo models, three plans and one advice stay
byte-identical to the golden files."""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner
from golden_cases import PLANS, argv, cases, path, plan_argv, plan_path, stable

from nnperf.cli.app import cli


@pytest.mark.parametrize(("model", "command"), cases())
def test_json_output_matches_golden_file(model: str, command: str):
    result = CliRunner().invoke(cli, argv(model, command))
    assert result.exit_code == 0, result.output
    if os.environ.get("NNPERF_REGEN_GOLDEN", "") not in ("", "0"):
        path(model, command).write_text(stable(result.output))
    assert stable(result.output) == path(model, command).read_text(), (
        f"{model} {command} --json changed; if intended, regenerate every golden file with "
        "NNPERF_REGEN_GOLDEN=1 python -m pytest tests/golden and review the diff"
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PLANS))
def test_plan_and_advice_match_golden_files(name: str):
    """Each plan traces its rank roles on a fake process group (10-30 s on 2 cores)."""
    result = CliRunner().invoke(cli, plan_argv(name))
    assert result.exit_code == 0, result.output
    assert stable(result.output) == plan_path(name).read_text(), (
        f"{name} --json changed; if intended, run python tests/golden/golden_cases.py {name}"
    )
