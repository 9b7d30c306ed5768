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


@pytest.mark.parametrize("name", ["rows.toml", "megatron_runs.toml", "vtrain_runs.toml", "megatron_bridge_runs.toml",
                                  "nemo_runs.toml", "megatron_bridge_moe_runs.toml", "dgxc_runs.toml",
                                  "megatron_readme_runs.toml", "megatron_moe_modelzoo_runs.toml",
                                  "llama3_runs.toml"])
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
        if "(Model, #-GPUs, GBS," in row["quote"]:  # a row of NeMo's table: its third column
            cells = [c.strip() for c in row["quote"].split("|")[1:]]
            assert (execution.world, execution.global_batch) == (int(cells[1]), int(cells[2])), row["id"]
        scale = re.search(r"(\d+)x H100 GPUs.*?GBS[= ](\d+)", row["quote"])
        if scale:  # a column of a DGX Cloud Benchmarking table: its GPUs and global batch
            assert (execution.world, execution.global_batch) == tuple(map(int, scale.groups())), row["id"]
        if "(Model, Dispatcher, System, Precision, #GPUs" in row["quote"]:  # the MoE Model Zoo's table
            cells = [c.strip() for c in row["quote"].split("(")[0].split("|")[1:]]
            assert execution.token_dispatcher == {"DeepEP": "deepep", "A2A": "alltoall"}[cells[1]], row["id"]
            gpus, _, tp, _, ep, pp, edp, etp, vpp, dp, _, mbs, gbs, ga = (int(c) if c.isdigit() else c for c in cells[4:18])
            assert (execution.world, execution.tensor, execution.expert, execution.pipeline, execution.virtual_stages,
                    execution.data_parallel, execution.micro_batch, execution.global_batch, execution.grad_accum) == \
                (gpus, tp, ep, pp, vpp, dp, mbs, gbs, ga), row["id"]
            assert execution.folds_experts == (etp == 1) and tp * dp == ep * edp * etp, row["id"]
            assert execution.expert_overlap == ("+1f1b overlap" in row["quote"]), row["id"]
        if "EP overlap o" in row["quote"]:  # the Megatron-Bridge skill's controlled pair
            assert execution.expert_overlap == ("EP overlap on" in row["quote"]), row["id"]
        if "precision, GBS," in row["quote"]:  # Megatron-Bridge's: model or system, GPUs, precision, GBS
            # the table's own cells may hold parentheses ("FP8-CS (FP8-MX)"): the legend is the last
            cells = [c.strip() for c in row["quote"].rsplit(" (", 1)[0].split("|")]
            assert (execution.world, execution.global_batch) == (int(cells[1]), int(cells[3])), row["id"]


def test_megatron_readme_rows_are_their_teraflops_over_megatrons_flops_per_token():
    """Each weak-scaling row's tokens/s per GPU is its quoted teraFLOP/s over the FLOPs of a
    token by Megatron-LM's count (training.py num_floating_point_operations: 12 L h^2 (2 + s/h
    + 4 + V / (2 L h)) with 4h of MLP), recomputed here from the quote's own cells."""
    rows = [r for r in _rows("megatron_readme_runs.toml") if "teraFLOP/s per GPU" in r["quote"]]
    assert len(rows) == 9
    for row in rows:
        cells = [c.strip() for c in row["quote"].split("|")]
        hidden, layers = int(cells[2].split()[1]), int(cells[3].split()[0])
        tera = float(cells[9].split()[0])
        seq, vocab = row["seq"], row["overrides"]["vocab"]
        per_token = 12 * layers * hidden**2 * (2 + seq / hidden + 4 + vocab / (2 * layers * hidden))
        assert row["measured"] == pytest.approx(tera * 1e12 / per_token, abs=0.05), row["id"]
        assert (row["overrides"]["dim"], row["overrides"]["n_layer"]) == (hidden, layers)


def test_llama3_rows_are_their_teraflops_over_palms_model_flops():
    """Each Llama 3 405B row's step is its quoted TFLOP/s per GPU over the model FLOPs of its
    step as PaLM's MFU counts them (6N + 12 L H Q T a token), N counted here from the shape,
    the tokens from the quote's GPUs, DP, batch/DP and sequence."""
    rows = _rows("llama3_runs.toml")
    assert len(rows) == 3
    for row in rows:
        first, *rest = (c.strip() for c in row["quote"].split("|"))
        gpus = int(first.removesuffix(" GPUs").replace(",", ""))
        cells = dict(c.rsplit(" ", 1) for c in rest)
        o = row["overrides"]
        dim, layers, kv = o["dim"], o["n_layer"], o["dim"] // o["n_heads"] * o["n_kv_heads"]
        n = 2 * o["vocab"] * dim + layers * (2 * dim * dim + 2 * dim * kv + 3 * dim * o["ffn_hidden"] + 2 * dim) + dim
        seq = int(cells["Seq. Len."].replace(",", ""))
        tokens = int(cells["DP"]) * int(cells["Batch size/DP"]) * seq
        flops = (6 * n + 12 * layers * dim * seq) * tokens
        assert n == 405_853_388_800
        assert row["measured"] == pytest.approx(flops / (float(cells["TFLOPs/GPU"]) * 1e12 * gpus), abs=0.001)
        assert (seq, row["execution"]["world"], tokens) == (row["seq"], gpus, 16_777_216)


def _plan_compare():
    spec = importlib.util.spec_from_file_location("plan_compare", FOLDER.parent / "plan_compare.py")
    compare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compare)
    return compare


def test_a_refused_row_is_counted_and_the_others_still_run(tmp_path, capsys):
    """A row whose stages cannot hold its layers (10 over 4 stages) is reported with its reason
    and counted; it does not stop the table (no row here is predicted: both are refused
    before any trace)."""
    row = ('[[row]]\nid = "{id}"\ngroup = "g"\nsource = "s"\nmodel = "gpt2"\n'
           'overrides = {{ n_layer = 10, n_embd = 64, n_head = 4, vocab = 128 }}\nseq = 64\n'
           'gpu = "h100-sxm"\ncluster = "dgx-h100"\n'
           'execution = {{ world = 4, pipeline = 4, micro_batch = 1, grad_accum = 4, {extra} }}\n'
           'metric = "step_time_s"\nmeasured = 1.0\ngrade = "approximate"\n')
    rows = tmp_path / "rows.toml"
    rows.write_text(row.format(id="uneven", extra='pipeline_schedule = "1f1b"')
                    + row.format(id="too-short", extra='pipeline_schedule = "1f1b", first_stage_layers = 9'))
    assert _plan_compare().main(["--rows", str(rows)]) == 0
    out = capsys.readouterr().out
    assert "uneven" in out and "10 layers do not split evenly into 4 pipeline stages" in out
    assert "too-short" in out and "cannot hold 10 layers" in out
    assert "2 of 2 rows refused" in out


def test_a_failing_row_is_said_and_the_others_still_run(tmp_path, capsys):
    """A row that errors (a metric plan_compare does not know, found before any trace) is
    reported as FAILED with the error, the table goes on and exits 1; an execution field
    nnperf's layout does not have is named, not silently dropped."""
    row = ('[[row]]\nid = "{id}"\ngroup = "g"\nsource = "s"\nmodel = "gpt2"\n'
           'overrides = {{ n_layer = 10, n_embd = 64, n_head = 4, vocab = 128 }}\nseq = 64\n'
           'gpu = "h100-sxm"\ncluster = "dgx-h100"\n'
           'execution = {{ world = 4, pipeline = 4, micro_batch = 1, grad_accum = 4, {extra} }}\n'
           'metric = "{metric}"\nmeasured = 1.0\ngrade = "approximate"\n')
    rows = tmp_path / "rows.toml"
    rows.write_text(row.format(id="odd-field", extra='pipeline_schedule = "1f1b", recompute_method = "uniform"',
                               metric="step_time_s")
                    + row.format(id="odd-metric", extra='pipeline_schedule = "1f1b", first_stage_layers = 1',
                                 metric="mfu"))
    compare = _plan_compare()
    compare.evaluate = _refuse  # no trace: the row's handling is what is tested
    assert compare.main(["--rows", str(rows)]) == 1
    captured = capsys.readouterr()
    assert "odd-field" in captured.err and "ignored: recompute_method" in captured.err
    assert "odd-metric" in captured.err and "FAILED: ValueError: odd-metric: unknown metric mfu (valid: step_time_s, " in captured.err
    assert "1 of 2 rows refused" in captured.out and "1 rows FAILED" in captured.out


def _refuse(*args, **kwargs):
    from nnperf.errors import UsageError

    raise UsageError("not traced in this test")


@pytest.mark.slow
@pytest.mark.accuracy
def test_the_larger_megatron_turing_runs_are_predicted_faster():
    compare = _plan_compare()
    rows = [r for r in _rows("megatron_runs.toml") if r["id"].startswith("mtnlg")]
    predicted = [compare.predict(row)[0] for row in rows]
    measured = [row["measured"] for row in rows]
    assert compare.spearman(measured, predicted) == 1.0


def test_layouts_that_ran_but_are_planned_not_to_fit_are_counted_and_named():
    """Every row ran as published: the summary counts the layouts planned to fit and names the
    others with their planned peak."""
    rows = [{"id": "a", "group": "g", "grade": "faithful", "source": "s", "measured": 1.0, "predicted": 1.1,
             "error": 0.1, "planned_memory_gib": 70.0, "fits": True},
            {"id": "b", "group": "g", "grade": "faithful", "source": "s", "measured": 2.0, "predicted": 1.8,
             "error": -0.1, "planned_memory_gib": 97.44, "fits": False}]
    summary = _plan_compare().summarize(rows)
    assert summary["fits"] == 1
    assert summary["not_fitting"] == ["b (97.4 GiB)"]
