"""--moe-load / --moe-capacity-factor: the routing a fake trace assumes for a mixture of experts;
a bad value is one line and exit 2 (the model loads; the setting is wrong)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from nnperf.cli.app import cli

MOE = "tests/trace/test_trace_moe.py:GroupedMoE"


@pytest.mark.parametrize(("args", "message"), [
    (["--moe-load", "a,b"], "invalid --moe-load 'a,b'"),
    (["--moe-load", "1,1"], "2 shares but the router chooses among 8 experts"),
    (["--moe-capacity-factor", "0.5"], "must be at least 1"),
])
def test_bad_routing_is_one_line_exit_2(args, message):
    res = CliRunner().invoke(cli, ["analyze", MOE, "--input-shape", "2,16,64", "--dtype", "bf16", *args])
    assert res.exit_code == 2, res.output
    assert message in res.stderr and "Traceback" not in res.output
    assert len(res.stderr.strip().splitlines()) == 1


def test_the_assumption_is_in_the_json_config():
    res = CliRunner().invoke(cli, ["analyze", MOE, "--input-shape", "2,16,64", "--dtype", "bf16",
                                   "--moe-load", "4,2,1,1,0,0,0,0", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert "shares 0.5, 0.25, 0.125, 0.125, 0, 0, 0, 0 (--moe-load)" in doc["config"]["assumptions"][0]
    up = [g for g in doc["gemms"] if g["op"] == "aten._grouped_mm" and g["phase"] == "forward" and g["n"] == 256]
    assert [g["m"] for g in up] == [32, 16, 8, 8]
