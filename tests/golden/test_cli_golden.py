"""advise, plan, compare, gemm and gpus --json stay identical, in structure and values, to their
golden files (``cli_cases``); ``NNPERF_REGEN_GOLDEN=1`` rewrites them instead."""

from __future__ import annotations

import json

import pytest
from cli_cases import CASES, REGENERATE, path, regenerating, run

SLOW = {"advise", "plan"}  # several traces and searches each


@pytest.mark.parametrize("command", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW else c for c in CASES])
def test_json_output_matches_golden_file(command: str):
    text = run(command)
    if regenerating():
        path(command).write_text(text)
    golden = path(command).read_text()
    assert json.loads(text) == json.loads(golden) and text == golden, (
        f"{command} --json changed; if intended, regenerate with {REGENERATE}=1 python -m pytest "
        f"tests/golden/test_cli_golden.py and review the diff"
    )
