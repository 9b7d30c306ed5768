"""``nnperf gemm --sweep``: a sweep above the row cap is refused at once, before any row
(or list of sizes) exists, naming its size and the cap (a list of 10**18 sizes could not be made:
the test would not end)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from nnperf.cli.app import cli


@pytest.mark.parametrize(("spec", "count"), [
    ("k:1024:1000000000:1", "999,998,977"),
    ("k:1:1000000000000000000:1", "1,000,000,000,000,000,000"),  # a list this long cannot exist
])
def test_a_sweep_above_the_cap_is_refused_before_any_row_is_made(spec, count):
    result = CliRunner().invoke(cli, ["gemm", "64", "64", "64", "--sweep", spec])
    assert result.exit_code == 2, result.output
    assert count in result.output and "at most 5,000" in result.output
    assert "Traceback" not in result.output


def test_a_sweep_at_the_cap_still_runs():
    result = CliRunner().invoke(cli, ["gemm", "64", "64", "64", "--sweep", "k:1:5000:1", "--json"])
    assert result.exit_code == 0, result.output
