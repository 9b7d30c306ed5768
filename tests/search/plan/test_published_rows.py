"""The published multi-GPU runs plan_compare.py predicts (validation/multi_gpu/): every row's
layout is one the plan accepts (its record validates, its stages hold its layers, its
micro-batches make the global batch the source states), and, recomputing Megatron-Turing NLG
530B's three runs (marked accuracy: minutes), the faster of them is predicted faster."""

from __future__ import annotations

import importlib.util
import re
from dataclasses import fields
from pathlib import Path

import pytest
import tomllib

from nnperf.layout import Execution

FOLDER = Path(__file__).resolve().parents[3] / "validation" / "multi_gpu"
_FIELDS = {f.name for f in fields(Execution)}


def _rows(name: str) -> list[dict]:
    return tomllib.loads((FOLDER / name).read_text())["row"]


@pytest.mark.parametrize("name", ["rows.toml", "megatron_runs.toml", "vtrain_runs.toml"])
def test_every_reproducible_row_is_a_layout_the_plan_accepts(name):
    for row in _rows(name):
        if not row.get("reproducible", True):
            continue
        execution = Execution(**{k: v for k, v in row["execution"].items() if k in _FIELDS})
        execution.validate()
        layers = row.get("overrides", {}).get("n_layer")
        if layers and execution.pipeline > 1:
            assert sum(execution.chunk_layers(layers)) == layers
        batch = re.search(r"batch (\d+)", row["quote"])
        if batch and name != "rows.toml":
            assert execution.global_batch == int(batch.group(1)), row["id"]


@pytest.mark.slow
@pytest.mark.accuracy
def test_the_larger_megatron_turing_runs_are_predicted_faster():
    spec = importlib.util.spec_from_file_location("plan_compare", FOLDER.parent / "plan_compare.py")
    compare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compare)
    rows = [r for r in _rows("megatron_runs.toml") if r["id"].startswith("mtnlg")]
    predicted = [compare.predict(row)[0] for row in rows]
    measured = [row["measured"] for row in rows]
    assert compare.spearman(measured, predicted) == 1.0
