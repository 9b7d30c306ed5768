"""analyze/predict/memory/fit --json of three zoo models stay byte-identical to the golden files."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from golden_cases import argv, cases, path, stable

from nnperf.cli.app import cli


@pytest.mark.parametrize(("model", "command"), cases())
def test_json_output_matches_golden_file(model: str, command: str):
    result = CliRunner().invoke(cli, argv(model, command))
    assert result.exit_code == 0, result.output
    assert stable(result.output) == path(model, command).read_text(), (
        f"{model} {command} --json changed; if intended, run python tests/golden/golden_cases.py"
    )
