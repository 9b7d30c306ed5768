"""nnperf plan end to end on a 2-layer GPT-2: ranked layouts, JSON, bad input in one line."""

from __future__ import annotations

import json

from click.testing import CliRunner

from nnperf.cli.app import cli

ARGS = ["plan", "gpt2", "-O", "n_layer=2", "--batch", "2", "--seq", "128", "--amp", "bf16", "--gpu", "h100"]


def test_plan_ranks_layouts_and_emits_torchtitan():
    result = CliRunner().invoke(cli, [*ARGS, "--gpus", "16", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    layouts = {r["execution"]["data"] for r in doc["ranked"]}
    assert layouts == {"ddp", "fsdp", "hsdp"}
    steps = [r["step_time_s"] for r in doc["ranked"]]
    assert steps == sorted(steps)
    ddp = next(r for r in doc["ranked"] if r["execution"]["data"] == "ddp")
    fsdp = next(r for r in doc["ranked"] if r["execution"]["data"] == "fsdp")
    # DDP all-reduces every fp32 gradient once: 4 bytes per parameter
    assert ddp["collectives"]["all_reduce"]["bytes"] == ddp["per_rank_state_bytes"]["gradients"]
    # FSDP2 keeps 1/16 of the state DDP keeps on each GPU (padding aside)
    assert fsdp["per_rank_state_bytes"]["optimizer_state"] < ddp["per_rank_state_bytes"]["optimizer_state"] / 15
    assert "data_parallel_shard_degree" in doc["torchtitan"]
    assert doc["torchrun"].startswith("torchrun --nnodes=2 --nproc_per_node=8")


def test_a_gpu_count_the_nodes_do_not_divide_is_one_line():
    result = CliRunner().invoke(cli, [*ARGS, "--gpus", "12"])
    assert result.exit_code == 2
    assert "nearest: 8 or 16" in result.output and len(result.output.strip().splitlines()) == 1
