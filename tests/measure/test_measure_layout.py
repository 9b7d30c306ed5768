"""``nnperf measure --layout PLAN.json`` under torchrun, end to end on this CPU with gloo: the
plan's per-rank parameter, gradient and optimizer-state bytes are what the real ranks hold (the
real run's local shards, counted here from its storages), and a plan it cannot run is one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from click.testing import CliRunner

from nnperf.cli.app import cli

pytestmark = pytest.mark.process

MODEL = ["llama-7b", "-O", "n_layer=1", "-O", "dim=64", "-O", "n_heads=4", "-O", "ffn_hidden=128",
         "-O", "vocab=256", "--seq", "32", "--batch", "2"]


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    result = CliRunner().invoke(cli, ["plan", *MODEL, "--gpu", "h100", "--gpus", "2", "--tp", "1,2", "--pp", "1",
                                      "--json"])
    assert result.exit_code == 0, result.output
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    path.write_text(result.output)
    return path


def _torchrun(model: list[str], layout: str, ranks: int = 2) -> subprocess.CompletedProcess:
    """torchrun with CPU ranks; on a timeout the whole process group goes (torchrun's workers
    would outlive it)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", "-m",
            "nnperf", "measure", *model, "--layout", layout, "--device", "cpu", "--steps", "2", "--warmup", "1",
            "--json"]
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                          start_new_session=True) as process:
        try:
            out, err = process.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            raise
    return subprocess.CompletedProcess(args, process.returncode, out, err)


def test_every_planned_layout_holds_the_planned_state_on_real_ranks(plan_file):
    plan = json.loads(plan_file.read_text())
    kinds = {(r["execution"]["data"], r["execution"]["tensor"]) for r in plan["ranked"]}
    assert {("fsdp", 1), ("ddp", 1), ("zero1", 1)} <= kinds and any(t == 2 for _, t in kinds)
    for index, row in enumerate(plan["ranked"]):
        done = _torchrun(MODEL, f"{plan_file}:{index}")
        assert done.returncode == 0, f"layout {index}: {done.stderr[-3000:]}\nstdout: {done.stdout[-300:]}"
        doc = json.loads(done.stdout)
        ranks = doc["measured"]["ranks"]
        assert [r["rank"] for r in ranks] == [0, 1]
        assert row["rank"] is not None  # one block: every layout traced whole, its rank known
        assert ranks[row["rank"]]["state_bytes"] == row["per_rank_state_bytes"], row["layout"]
        assert all(t > 0 for r in ranks for t in r["step_times_s"])
        assert doc["comparable"] is False and doc["step_time_error"] is None  # a CPU run of a GPU plan
        if row["execution"]["data"] == "fsdp":  # half of DDP's state on each rank (up to FSDP's padding)
            ddp = next(r for r in plan["ranked"] if r["execution"]["data"] == "ddp")
            assert ranks[0]["state_bytes"]["parameters"] <= ddp["per_rank_state_bytes"]["parameters"] / 2 + 64


def test_a_layout_outside_torchrun_or_of_another_plan_is_one_line(plan_file, tmp_path):
    env = {"WORLD_SIZE": None, "RANK": None, "LOCAL_RANK": None}  # not under torchrun, whatever runs the tests
    cases = [
        ([*MODEL, "--layout", str(plan_file)], "start it with torchrun"),
        ([*MODEL, "--layout", f"{plan_file}:9"], "'9' is not a position in the plan's"),
        (["gpt2", "--layout", str(plan_file)], "is a plan of llama-7b"),
        ([*MODEL, "--amp", "bf16", "--layout", str(plan_file)], "planned with amp=None"),
        ([*MODEL, "-O", "n_layer=2", "--layout", str(plan_file)], "was planned for another model: n_layer planned 1, got 2"),
        ([*MODEL, "--layout", str(tmp_path / "missing.json")], "does not exist"),
        ([*MODEL, "--layout", str(tmp_path / "a:b" / "plan.json:1")], "does not exist"),
    ]
    for args, message in cases:
        result = CliRunner(env=env).invoke(cli, ["measure", *args, "--device", "cpu"])
        assert result.exit_code == 2, result.output
        assert message in result.output and len(result.output.strip().splitlines()) == 1, result.output


MOE = ["mixtral-8x7b", "-O", "n_layer=1", "-O", "dim=64", "-O", "n_heads=4", "-O", "n_kv_heads=2",
       "-O", "ffn_hidden=64", "-O", "vocab=256", "--seq", "32", "--batch", "1", "--amp", "bf16"]


@pytest.mark.parametrize("data", ["fsdp", "ddp"])
def test_an_expert_parallel_layout_holds_the_planned_state_on_4_real_ranks(tmp_path, data):
    """FSDP2 or DDP over 4 ranks with 8 experts over 2 of them, bf16 autocast: the real router is
    not the uniform one the plan assumes, but what each rank holds does not depend on it."""
    moe = MOE
    planned = CliRunner().invoke(cli, ["plan", *moe, "--gpu", "h100", "--gpus", "4", "--tp", "1", "--pp", "1",
                                       "--ep", "2", "--data", data, "--json"])
    assert planned.exit_code == 0, planned.output
    plan = json.loads(planned.output)
    index, row = next((i, r) for i, r in enumerate(plan["ranked"]) if r["execution"]["expert"] == 2)
    path = tmp_path / "plan.json"
    path.write_text(planned.output)
    done = _torchrun(moe, f"{path}:{index}", ranks=4)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = json.loads(done.stdout)["measured"]["ranks"]
    assert [r["state_bytes"] for r in ranks] == [row["per_rank_state_bytes"]] * 4


def test_a_plan_is_measured_with_the_models_defaults_left_unspelled(tmp_path):
    """The README's pair: ``plan gpt2 -O n_layer=2 --gpus 2 -o plan.json`` then ``measure gpt2
    -O n_layer=2 --device cpu --layout plan.json``. The plan records the resolved sequence
    (gpt2's 1024); the measurement left --seq out, which is the same model: it was refused
    ("planned with --seq 1024 ... got --seq default"). Outside torchrun the only error left is
    the missing torchrun, so every check of the plan against the command passed."""
    path = tmp_path / "plan.json"
    planned = CliRunner().invoke(cli, ["plan", "gpt2", "-O", "n_layer=2", "--gpus", "2", "--tp", "1", "--pp", "1",
                                       "-o", str(path)])
    assert planned.exit_code == 0, planned.output
    plan = json.loads(path.read_text())
    assert (plan["seq_len"], plan["model_options"]) == (1024, {"n_layer": 2})
    env = {"WORLD_SIZE": None, "RANK": None, "LOCAL_RANK": None}
    for spelled in (["-O", "n_layer=2"], ["-O", "n_layer=2", "--seq", "1024"], ["--seq", "1024", "-O", "n_layer=2.0"]):
        result = CliRunner(env=env).invoke(cli, ["measure", "gpt2", *spelled, "--device", "cpu", "--layout", str(path)])
        assert result.exit_code == 2 and "start it with torchrun" in result.output, (spelled, result.output)
    other = CliRunner(env=env).invoke(cli, ["measure", "gpt2", "-O", "n_layer=2", "--seq", "512", "--device", "cpu",
                                            "--layout", str(path)])
    assert "seq_len planned 1024, got 512" in other.output


def test_zero1_with_experts_is_planned_not_measured(tmp_path):
    path = tmp_path / "plan.json"
    planned = CliRunner().invoke(cli, ["plan", *MOE, "--gpu", "h100", "--gpus", "4", "--tp", "1", "--pp", "1",
                                       "--ep", "2", "--data", "zero1", "-o", str(path)])
    assert planned.exit_code == 0, planned.output
    env = {"WORLD_SIZE": None, "RANK": None, "LOCAL_RANK": None}
    result = CliRunner(env=env).invoke(cli, ["measure", *MOE, "--device", "cpu", "--layout", str(path)])
    assert result.exit_code == 2 and "ZeRO-1 with expert parallelism is planned, not run" in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


GPT2 = ["gpt2", "-O", "n_layer=2", "--seq", "128"]


@pytest.mark.parametrize(("workload", "layout", "field", "flag"), [
    ([*GPT2, "--pointwise", "fused"], ["--tp", "2", "--data", "fsdp"], "async_tp", "--async-tp"),
    (GPT2, ["--tp", "2", "--data", "zero1"], "tp_comm_overlap", "--tp-comm-overlap"),
    (MOE, ["--tp", "1", "--ep", "2", "--data", "ddp"], "expert_overlap", "--ep-overlap"),
])
def test_an_overlap_the_ranks_do_not_run_is_planned_not_measured(tmp_path, workload, layout, field, flag):
    """The ranks run DTensor's collectives eagerly and each micro-batch's forward and backward
    one after the other: a layout planned with torch's async TP (Inductor's compiled blocks),
    Transformer Engine's userbuffers or Megatron-Core's combined 1F1B is one line, not a
    measurement of something else."""
    path = tmp_path / "plan.json"
    planned = CliRunner().invoke(cli, ["plan", *workload, "--gpu", "h100", "--gpus", "4", "--pp", "1", *layout, flag,
                                       "-o", str(path)])
    assert planned.exit_code == 0, planned.output
    ranked = json.loads(path.read_text())["ranked"]
    at = next(i for i, r in enumerate(ranked) if r["execution"][field])
    env = {"WORLD_SIZE": None, "RANK": None, "LOCAL_RANK": None}
    result = CliRunner(env=env).invoke(cli, ["measure", *workload, "--device", "cpu", "--layout", f"{path}:{at}"])
    assert result.exit_code == 2 and f"{flag} is planned, not run" in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
