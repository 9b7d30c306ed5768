"""analyze/predict/memory/fit --json of three zoo models stay byte-identical to the golden files."""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner
from golden_cases import argv, cases, path, stable

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
