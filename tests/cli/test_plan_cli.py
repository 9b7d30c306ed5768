"""nnperf plan end to end on a 2-layer GPT-2: ranked layouts, JSON, bad input in one line."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from nnperf.cli.app import cli

ARGS = ["plan", "gpt2", "-O", "n_layer=2", "--batch", "2", "--seq", "128", "--amp", "bf16", "--gpu", "h100"]


def test_plan_ranks_layouts_and_emits_torchtitan():
    result = CliRunner().invoke(cli, [*ARGS, "--gpus", "16", "--tp", "1", "--pp", "1", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    layouts = {r["execution"]["data"] for r in doc["ranked"]}
    assert layouts == {"ddp", "zero1", "fsdp", "hsdp"}
    steps = [r["step_time_s"] for r in doc["ranked"]]
    assert steps == sorted(steps)
    ddp = next(r for r in doc["ranked"] if r["execution"]["data"] == "ddp")
    fsdp = next(r for r in doc["ranked"] if r["execution"]["data"] == "fsdp")
    # DDP all-reduces every fp32 gradient once: 4 bytes per parameter
    assert ddp["collectives"]["all_reduce"]["bytes"] == ddp["per_rank_state_bytes"]["gradients"]
    # FSDP2 keeps 1/16 of the state DDP keeps on each GPU (padding aside)
    assert fsdp["per_rank_state_bytes"]["optimizer_state"] < ddp["per_rank_state_bytes"]["optimizer_state"] / 15
    # ZeRO-1 keeps DDP's parameters and gradients and a 16th of every bucket's optimizer state
    # (AdamW: two fp32 moments per element), the few elements 16 does not divide in each
    # bucket on every rank, and a 4-byte step per share
    zero1 = next(r for r in doc["ranked"] if r["execution"]["data"] == "zero1")
    assert zero1["per_rank_state_bytes"]["parameters"] == ddp["per_rank_state_bytes"]["parameters"]
    elements = ddp["per_rank_state_bytes"]["parameters"] // 4
    buckets = zero1["collectives"]["reduce_scatter"]["count"]
    tails = zero1["collectives"].get("all_reduce", {}).get("bytes", 0)  # what 16 does not divide
    assert zero1["collectives"]["reduce_scatter"]["bytes"] + tails == 4 * elements  # each gradient reduced once
    assert 8 * elements / 16 <= zero1["per_rank_state_bytes"]["optimizer_state"] <= \
        8 * elements / 16 + buckets * (8 * 16 + 8) and zero1["rank"] == 0
    assert "data_parallel_shard_degree" in doc["torchtitan"]
    assert doc["torchrun"].startswith("torchrun --nnodes=2 --nproc_per_node=8")


def test_a_gpu_count_the_nodes_do_not_divide_is_one_line():
    result = CliRunner().invoke(cli, [*ARGS, "--gpus", "12"])
    assert result.exit_code == 2
    assert "nearest: 8 or 16" in result.output and len(result.output.strip().splitlines()) == 1


def test_tensor_and_pipeline_layouts_with_engine_configs():
    """gpt2 (4 blocks, 4 heads) on 8 GPUs: tensor-parallel degrees 2 and 4 with sequence
    parallelism, pipelines of 2 and 4 stages; the winner written for each engine that has it."""
    args = ["plan", "gpt2", "-O", "n_layer=4", "-O", "n_head=4", "-O", "n_embd=256", "--batch", "4", "--seq", "64",
            "--amp", "bf16", "--gpu", "h100", "--gpus", "8", "--json"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    executions = [r["execution"] for r in doc["ranked"] + doc["rejected"]]
    assert {e["tensor"] for e in executions} >= {1, 2, 4}
    assert any(e["tensor"] > 1 and e["sequence_parallel"] for e in executions)
    piped = [r for r in doc["ranked"] if r["execution"]["pipeline"] > 1]
    assert piped and all(0 < r["pipeline"]["bubble_fraction"] < 1 for r in piped)
    assert "pipeline_bubble_s" in piped[0]["time_split_s"]
    assert doc["torchrun"].startswith("torchrun --nnodes=1 --nproc_per_node=8")
    for engine in ("torchtitan", "megatron", "deepspeed"):
        assert doc[engine] or doc[f"{engine}_not_expressible"]


def test_a_tensor_degree_the_heads_do_not_allow_is_one_line():
    result = CliRunner().invoke(cli, [*ARGS, "--gpus", "8", "--tp", "5"])
    assert result.exit_code == 2
    assert "tensor parallel degree 5 does not divide n_head = 12" in result.output
    # 6 divides the heads and the MLP but not the 128-token sequence sequence parallelism splits
    assert result.output.strip().endswith("nearest valid degrees: 4") and len(result.output.strip().splitlines()) == 1


def test_a_pipeline_the_layers_do_not_allow_is_one_line():
    result = CliRunner().invoke(cli, [*ARGS, "--gpus", "6", "--pp", "3"])
    assert result.exit_code == 2
    assert result.output.strip().endswith("2 layers do not split evenly into 3 pipeline stages; nearest valid "
                                          "pipeline degrees on 6 GPUs: 2"), result.output


def test_the_pipeline_degrees_a_bad_split_names_divide_the_gpus():
    """12 blocks over 8 stages on 8 GPUs: 6 and 12 split the blocks but not the GPUs; of the
    degrees that do both (1, 2, 4), 4 is the nearest below 8 and none is above. Beside a tensor
    degree, the GPUs it leaves."""
    result = CliRunner().invoke(cli, [*ARGS, "-O", "n_layer=12", "--gpus", "8", "--pp", "8", "--data", "zero1"])
    assert result.exit_code == 2, result.output
    assert "12 layers do not split evenly into 8 pipeline stages; nearest valid pipeline degrees on 8 GPUs: 4;" \
        in result.output and len(result.output.strip().splitlines()) == 1
    # beside --tp 8 on 48 GPUs a pipeline degree must divide the 6 GPUs left: of 8 blocks' 1, 2, 4, 8,
    # only 2 (4 x 8 = 32 does not divide 48)
    result = CliRunner().invoke(cli, [*ARGS, "-O", "n_layer=8", "-O", "n_head=16", "--gpus", "48", "--tp", "8",
                                      "--pp", "3"])
    assert result.exit_code == 2, result.output
    assert "8 layers do not split evenly into 3 pipeline stages; nearest valid pipeline degrees with --tp 8 on " \
           "48 GPUs: 2;" in result.output and len(result.output.strip().splitlines()) == 1


def test_pipeline_splits_that_cannot_hold_the_layers_are_one_line():
    """10 blocks: no even split over 4 stages (the shortened first and last stages that would hold
    them named); an uneven split whose middle stages cannot share the rest; interleaving whose
    chunks do not divide a stage's 4 blocks (12 blocks over 3 stages)."""
    cases = [
        (["--gpus", "8", "-O", "n_layer=10", "--pp", "4"], "10 layers do not split evenly into 4 pipeline stages; nearest valid "
         "pipeline degrees on 8 GPUs: 2; or shorten the first and last stages (--first-stage-layers, --last-stage-layers: "
         "first = last = 2 (3 in each other stage); first = last = 1 (4 in each other stage))"),
        (["--gpus", "8", "-O", "n_layer=10", "--pp", "4", "--first-stage-layers", "3", "--schedule", "1f1b"],
         "an uneven split with first stage layers 3 "
         "cannot hold 10 layers in 4 pipeline stages"),
        (["--gpus", "24", "-O", "n_layer=12", "--pp", "3", "--vpp", "3", "--schedule", "interleaved-1f1b"],
         "3 virtual stages do not divide the 4 layers per pipeline stage (12 layers over 3 stages); valid: 2, 4"),
    ]
    for extra, words in cases:
        _refused_in_one_line([*ARGS, *extra], words)


def test_a_global_batch_the_fixed_degrees_cannot_split_names_the_nearest_ones():
    """8 GPUs at tp 2 x pp 1 leave 4 data-parallel ranks: 18 samples do not divide over them
    (nearest: 16 or 20), and with micro-batches of 2 the unit is 8 (16 or 24). 16 GPUs at pp 4
    leave 4 ranks too: 6 samples do not divide, and 8 runs (Megatron-LM's 1F1B takes 2
    micro-batches a rank on 4 stages), the nearest above, where a multiple of the stages (16) is
    not needed."""
    args = [a for i, a in enumerate(ARGS) if a != "--batch" and ARGS[i - 1] != "--batch"]
    cases = ((["--gpus", "8", "--tp", "2", "--pp", "1", "--global-batch", "18"],
              "the global batch 18 does not divide over the 4 data-parallel ranks (8 GPUs / (tp 2)); try "
              "--global-batch 16 or 20"),
             (["--gpus", "8", "--tp", "2", "--pp", "1", "--global-batch", "18", "--micro-batch", "2"],
              "the global batch 18 does not divide over the 4 data-parallel ranks (8 GPUs / (tp 2)) in micro-batches "
              "of 2; try --global-batch 16 or 24"),
             (["-O", "n_layer=4", "--gpus", "16", "--tp", "1", "--pp", "4", "--global-batch", "6"],
              "the global batch 6 does not divide over the 4 data-parallel ranks (16 GPUs / (tp 1 x pp 4)); try "
              "--global-batch 4 or 8"))
    for extra, words in cases:
        _refused_in_one_line([*args, *extra], words)


def test_degrees_no_layout_of_the_gpus_can_have_are_one_line():
    """The model allows them, the GPU count does not: refused with the valid degrees, instead of
    searching the other axes only (--cp 3 on 8 GPUs used to plan pipelines) or failing inside."""
    # tp 4 divides the heads, the MLP, the sequence and the 12 GPUs, but neither divides nor fills
    # whole 6-GPU nodes
    cases = (("12", "6", ["--tp", "4"], "--tp 4: a tensor-parallel group fills nodes evenly, so its degree divides "
              "the 6 GPUs per node or is whole nodes of them, and divides the 12 GPUs; valid: 1, 2, 3, 6, 12"),
             ("8", "2", ["--cp", "3"], "--cp 3 does not divide the 8 GPUs; valid: 1, 2, 4, 8"),
             ("16", "8", ["--tp", "2", "--cp", "16"], "--cp 16: tensor x pipeline (2) x context does not divide "
              "the 16 GPUs; valid: 1, 2, 4, 8"))
    for gpus, per_node, options, words in cases:
        result = CliRunner().invoke(cli, [*ARGS, "--gpus", gpus, "--nodes-of", per_node, *options, "--pp", "1"])
        assert result.exit_code == 2 and words in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1


def test_valid_degrees_are_those_the_other_asked_degrees_leave():
    """A pipeline degree the GPUs refuse is named before the layers' split (whose nearest degrees
    need not divide the GPUs either), and each valid list is of what the asked tensor (and
    pipeline) degree leaves of the GPUs, pipelines no deeper than the layers: 20 GPUs (nodes of 4)
    at --tp 2 leave 10 for the pipeline (8 needs 16), 16 at --tp 2 --pp 2 leave 4 for the context."""
    cases = ((["-O", "n_layer=12", "--gpus", "20", "--nodes-of", "4", "--tp", "2", "--pp", "8"],
              "--tp 2 x --pp 8 = 16 does not divide the 20 GPUs; pipeline degrees with --tp 2: 1, 2, 5, 10"),
             (["-O", "n_layer=4", "--gpus", "24", "--pp", "16"], "--pp 16 does not divide the 24 GPUs; valid: 1, 2, 3, 4"),
             (["--gpus", "16", "--tp", "2", "--pp", "2", "--cp", "3"],
              "--cp 3: tensor x pipeline (4) x context does not divide the 16 GPUs; valid: 1, 2, 4"),
             (["--gpus", "16", "--tp", "2", "--cp", "3"],
              "--cp 3: tensor x pipeline (2) x context does not divide the 16 GPUs; valid: 1, 2, 4, 8"))
    for options, words in cases:
        result = CliRunner().invoke(cli, [*ARGS, *options])
        assert result.exit_code == 2 and result.output.strip().endswith(words), result.output
        assert len(result.output.strip().splitlines()) == 1


def test_tensor_parallelism_over_whole_nodes_when_asked():
    """The SC21 paper ran 16- and 32-way tensor parallelism over 8-GPU nodes: asked for, a
    group of whole nodes is planned (4 over two 2-GPU nodes), its collectives over the network."""
    result = CliRunner().invoke(cli, [*ARGS, "--gpus", "8", "--nodes-of", "2", "--tp", "4", "--pp", "1", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert document["ranked"] and {r["execution"]["tensor"] for r in document["ranked"]} == {4}
    assert any("tensor parallelism over 4 GPUs spans nodes of 2" in note for note in document["notes"])


def test_the_nodes_a_plan_is_given_are_where_its_collectives_cross():
    """--nodes-of 2 on DGX H100s: the cluster's links as they are, in nodes of 2 GPUs, so TP 4
    spans two nodes and its collectives run at the network's rate, slower than inside one node
    of 8 (where it was timed before --nodes-of reached the collectives)."""
    def planned(per_node: str) -> dict:
        result = CliRunner().invoke(cli, [*ARGS, "--gpus", "8", "--nodes-of", per_node, "--tp", "4", "--pp", "1",
                                          "--data", "ddp", "--json"])
        assert result.exit_code == 0, result.output
        return json.loads(result.output)

    apart, together = planned("2"), planned("8")
    assert (apart["cluster"]["gpus_per_node"], together["cluster"]["gpus_per_node"]) == (2, 8)
    assert apart["ranked"][0]["execution"] == together["ranked"][0]["execution"] | {"gpus_per_node": 2}
    assert (apart["ranked"][0]["time_split_s"]["communication_s"]
            > 2 * together["ranked"][0]["time_split_s"]["communication_s"])


def test_plan_is_for_training_steps():
    result = CliRunner().invoke(cli, [*ARGS, "--gpus", "8", "--inference"])
    assert result.exit_code == 2 and "lays out training steps" in result.output


def test_a_bf16_model_with_unfused_attention_plans_and_says_what_each_engine_can_run():
    """--dtype on a multi-GPU layout (once refused) and --sdpa unfused: the plan's JSON names the
    step's options; Megatron-LM gets --bf16 and --attention-backend unfused; torchtitan has
    neither setting, says both, and no torchrun command is offered for a TOML not written."""
    args = ["plan", "gpt2", "-O", "n_layer=2", "--seq", "128", "--gpu", "h100", "--gpus", "8",
            "--global-batch", "8", "--dtype", "bf16", "--sdpa", "unfused", "--json"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert (doc["options"]["dtype"], doc["options"]["sdpa"], doc["options"]["amp"]) == ("bf16", "unfused", None)
    assert "--bf16" in doc["megatron"] and "--attention-backend unfused" in doc["megatron"]
    assert doc["torchtitan"] is None and doc["torchrun"] is None
    assert "cast to bf16" in doc["torchtitan_not_expressible"]
    assert "unfused attention" in doc["torchtitan_not_expressible"]


MOE = ["plan", "mixtral-8x7b", "-O", "n_layer=2", "-O", "dim=256", "-O", "n_heads=4", "-O", "n_kv_heads=2",
       "-O", "ffn_hidden=512", "-O", "vocab=1024", "--seq", "256", "--amp", "bf16", "--gpu", "h100"]


def test_expert_parallel_layouts_of_a_mixture_of_experts_model():
    """Mixtral-shaped (8 experts, top-2) on 8 GPUs with FSDP over 8: experts over 1, 2, 4 and 8
    ranks. Each MoE layer's all-to-alls: the 8 per-expert token counts (int64), then its 256 x 2
    routed rows of 256 features there and back, and both again in backward. The rows are bf16:
    FSDP2 gathers bf16 parameters (torchtitan's mixed precision), so the residual stream is bf16."""
    result = CliRunner().invoke(cli, [*MOE, "--gpus", "8", "--tp", "1", "--pp", "1", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    fsdp = {r["execution"]["expert"]: r for r in doc["ranked"] if r["execution"]["data"] == "fsdp"}
    assert set(fsdp) == {1, 2, 4, 8}
    rows = 256 * 2 * 256 * 2
    counts = 8 * 8  # the per-expert token counts, int64
    for ep in (2, 4, 8):
        a2a = fsdp[ep]["collectives"]["all_to_all"]
        assert a2a["count"] == 2 * 5  # per layer: counts, dispatch, combine; their 2 gradients
        assert a2a["bytes"] == 2 * (counts + 4 * rows)  # 2 layers
    assert "all_to_all" not in fsdp[1]["collectives"]
    assert any("top-2 of 8 experts are assumed spread uniformly" in n for n in doc["notes"])


def test_expert_degrees_the_model_does_not_allow_are_one_line():
    for args, message in (([*MOE, "--ep", "3"], "--ep 3 does not divide the 8 GPUs"),
                          ([*ARGS, "--ep", "2"], "gpt2 has no experts"),
                          ([*MOE, "-O", "n_experts=6", "--ep", "4"],
                           "--ep 4 does not divide the model's 6 experts; valid (dividing them and the 8 GPUs): 1, 2\n"),
                          ([*MOE, "--tp", "2", "--data", "fsdp"], "torchtitan's expert tensor parallelism"),
                          ([*MOE, "--ep", "8", "--data", "ddp", "--pp", "2"],
                           "--ep 8 divides none of the groups the experts can spread over")):
        result = CliRunner().invoke(cli, [*args, "--gpus", "8"] + ([] if "--pp" in args else ["--pp", "1"])
                                    + ([] if "--tp" in args else ["--tp", "1"]))
        assert result.exit_code == 2, result.output
        assert message in result.output and len(result.output.strip().splitlines()) == 1


def test_a_mixture_of_experts_model_plans_with_the_default_axes():
    """--tp auto splits MoE layers as Megatron-LM does, beside DDP or ZeRO-1 only (torchtitan's
    expert tensor parallelism is not modelled), and searches the expert degrees too: on 2 GPUs
    TP 2 leaves one data-parallel rank, so EP 2 there folds over the tensor-parallel ranks."""
    result = CliRunner().invoke(cli, [*MOE, "--gpus", "2", "--pp", "1", "--json"])
    assert result.exit_code == 0, result.output
    ranked = [r["execution"] for r in json.loads(result.output)["ranked"]]
    assert {(e["tensor"], e["expert"]) for e in ranked} == {(1, 1), (1, 2), (2, 1), (2, 2)}
    assert all(e["data"] in ("ddp", "zero1") and e["sequence_parallel"] for e in ranked if e["tensor"] == 2)


def test_experts_whole_on_a_rank_fold_over_the_tensor_ranks_where_asked():
    """--etp 1 (Megatron-LM's --expert-tensor-parallel-size 1) on 8 GPUs as TP 2 x ZeRO-1 over
    4 with EP 2: by default each rank holds 4 of the 8 experts split over its 2 tensor ranks;
    with --etp 1 the expert group is the 2 tensor-parallel ranks, each holding 4 whole experts
    (3 x 256 x 512 each, 2 layers, fp32): twice the expert weights a rank."""
    def ranked(*etp: str) -> dict:
        result = CliRunner().invoke(cli, [*MOE, "--gpus", "8", "--tp", "2", "--ep", "2", "--pp", "1", "--data", "zero1",
                                          "--micro-batch", "1", "--checkpoint", "none", *etp, "--json"])
        assert result.exit_code == 0, result.output
        return json.loads(result.output)

    default, whole, at_tp = ranked(), ranked("--etp", "1"), ranked("--etp", "2")
    assert [r["execution"]["expert_tensor"] for r in at_tp["ranked"]] == [2]  # the split that runs: over TP
    assert [r["execution"]["expert_tensor"] for r in whole["ranked"]] == [1]
    # without --etp the search ranks the default split and, at the winner's degrees, the experts whole
    searched = {r["execution"]["expert_tensor"]: (r["layout"], r["step_time_s"], r["memory_bytes"])
                for r in default["ranked"]}
    assert searched == {r["execution"]["expert_tensor"]: (r["layout"], r["step_time_s"], r["memory_bytes"])
                        for r in at_tp["ranked"] + whole["ranked"]}
    assert "EP x2 (experts whole, folded over TP)" in whole["ranked"][0]["layout"]
    assert "--expert-tensor-parallel-size 1" in whole["megatron"]
    assert "--expert-tensor-parallel-size 2" in at_tp["megatron"]
    expert_half = 4 * 3 * 256 * 512 // 2
    assert (whole["ranked"][0]["per_rank_state_bytes"]["parameters"]
            - at_tp["ranked"][0]["per_rank_state_bytes"]["parameters"]) == 4 * 2 * expert_half


def test_deepep_sends_a_token_once_per_node():
    """EP 8 over two 4-GPU nodes (ZeRO-1 over 8): with --dispatcher deepep the layout runs
    Megatron-LM's flex dispatcher with DeepEP, and its all-to-alls (the same bytes: the trace is
    the same) take less time across the nodes; the alltoall dispatcher otherwise."""
    def ranked(*dispatcher: str) -> dict:
        result = CliRunner().invoke(cli, [*MOE, "--gpus", "8", "--nodes-of", "4", "--tp", "1", "--ep", "8", "--pp",
                                          "1", "--data", "zero1", "--micro-batch", "1", "--checkpoint", "none",
                                          *dispatcher, "--json"])
        assert result.exit_code == 0, result.output
        return json.loads(result.output)

    plain, deepep = ranked(), ranked("--dispatcher", "deepep")
    assert plain["ranked"][0]["execution"]["token_dispatcher"] == "alltoall"
    assert deepep["ranked"][0]["execution"]["token_dispatcher"] == "deepep"
    assert "--moe-token-dispatcher-type alltoall" in plain["megatron"]
    assert "--moe-token-dispatcher-type flex \\\n  --moe-flex-dispatcher-backend deepep" in deepep["megatron"]
    assert deepep["ranked"][0]["collectives"]["all_to_all"] == plain["ranked"][0]["collectives"]["all_to_all"]
    assert (deepep["ranked"][0]["time_split_s"]["communication_s"]
            < plain["ranked"][0]["time_split_s"]["communication_s"])


def test_ep_overlap_runs_each_backward_beside_the_next_forward():
    """--ep-overlap: the layout is Megatron-LM's with --overlap-moe-expert-parallel-comm, its
    step no longer than without it (this tiny model's host issues the step: nothing to hide;
    the saving itself: tests/search/plan/test_expert_overlap.py)."""
    def ranked(*flag: str) -> dict:
        result = CliRunner().invoke(cli, [*MOE, "--gpus", "8", "--nodes-of", "4", "--tp", "1", "--ep", "8", "--pp",
                                          "1", "--data", "zero1", "--micro-batch", "1", "--global-batch", "32",
                                          "--checkpoint", "none", *flag, "--json"])
        assert result.exit_code == 0, result.output
        return json.loads(result.output)

    plain, overlapped = ranked(), ranked("--ep-overlap")
    assert overlapped["ranked"][0]["execution"]["expert_overlap"] is True
    assert "all-to-alls overlapped" in overlapped["ranked"][0]["layout"]
    assert "--overlap-moe-expert-parallel-comm" in overlapped["megatron"]
    assert "--overlap-moe-expert-parallel-comm" not in plain["megatron"]
    assert overlapped["ranked"][0]["step_time_s"] <= plain["ranked"][0]["step_time_s"]
    assert overlapped["search"]["expert_overlap"] is True


def test_ep_overlap_where_it_cannot_run_is_one_line():
    for args, message in ((["--data", "fsdp", "--ep-overlap"], "--ep-overlap is Megatron-LM's "
                           "--overlap-moe-expert-parallel-comm, which runs beside ddp or zero1: --data fsdp has "
                           "neither"),):
        result = CliRunner().invoke(cli, [*MOE, "--gpus", "8", "--pp", "1", *args])
        assert result.exit_code == 2, result.output
        assert message in result.output and len(result.output.strip().splitlines()) == 1
    dense = CliRunner().invoke(cli, ["plan", "gpt2", "--gpus", "2", "--ep-overlap"])
    assert dense.exit_code == 2, dense.output
    assert "--ep-overlap overlaps a mixture of experts' all-to-alls, and the model has no experts" in dense.output
    # Megatron-Core's TransformerConfig asserts bf16 or fp16 beside the overlap: an fp32 plan is refused
    fp32 = CliRunner().invoke(cli, [*(a for a in MOE if a not in ("--amp", "bf16")), "--gpus", "8", "--tp", "1",
                                    "--ep", "8", "--pp", "1", "--data", "zero1", "--ep-overlap"])
    assert fp32.exit_code == 2, fp32.output
    assert ("Megatron-Core runs with a bf16 or fp16 model only, and this plan is fp32: add --amp bf16 (or --dtype "
            "bf16), or drop --ep-overlap") in fp32.output and len(fp32.output.strip().splitlines()) == 1


def test_expert_tensor_parallelism_it_does_not_model_is_one_line():
    for args, message in ((["--tp", "2", "--ep", "2", "--etp", "4"], "--etp 4: valid: auto (Megatron-Core's default: "
                           "each expert split over the tensor-parallel ranks, folded whole where the data-parallel "
                           "ranks cannot hold the expert group), 1 (each expert whole on a rank), 2 (the --tp degree: "
                           "the default split)"),
                          (["--tp", "2", "--ep", "2", "--etp", "two"], "invalid --etp 'two': expected auto"),
                          (["-O", "n_kv_heads=4", "--tp", "4", "--ep", "2", "--etp", "1"], "--ep 2 with --etp 1 folds the expert group over "
                           "the tensor-parallel ranks: a degree must be a multiple of the tensor degree whose "
                           "quotient divides the data-parallel ranks; valid: 4, 8"),
                          (["--data", "fsdp", "--dispatcher", "deepep"], "--dispatcher deepep is Megatron-LM's flex "
                           "dispatcher, which runs beside ddp or zero1: --data fsdp has neither")):
        result = CliRunner().invoke(cli, [*MOE, "--gpus", "8", "--pp", "1", *([] if "--data" in args else
                                                                               ["--data", "zero1"]), *args])
        assert result.exit_code == 2, result.output
        assert message in result.output and len(result.output.strip().splitlines()) == 1


DEEPSEEK = ["plan", "deepseek-v3-16b", "-O", "n_layer=3", "-O", "dim=128", "-O", "n_heads=4", "-O", "kv_lora=64",
            "-O", "qk_nope_dim=32", "-O", "qk_rope_dim=16", "-O", "v_head_dim=32", "-O", "ffn_hidden=256",
            "-O", "moe_hidden=64", "-O", "n_experts=4", "-O", "top_k=2", "-O", "vocab=512", "--seq", "64",
            "--amp", "bf16", "--gpu", "h100", "--gpus", "4", "--pp", "1"]


def test_a_model_whose_first_block_is_dense_offers_expert_parallelism():
    """DeepSeek's first block is dense (n_dense_layers 1): the expert axis is read from an expert
    block. 2 MoE blocks of 64 x 2 routed rows of 128 bf16 features: per block the counts (4
    int64 per rank), dispatch and combine, and their gradients."""
    result = CliRunner().invoke(cli, [*DEEPSEEK, "--ep", "auto", "--json"])
    assert result.exit_code == 0, result.output
    ranked = json.loads(result.output)["ranked"]
    fsdp = {r["execution"]["expert"]: r for r in ranked if r["execution"]["data"] == "fsdp"}
    assert set(fsdp) == {1, 2, 4}
    rows = 64 * 2 * 128 * 2
    assert fsdp[4]["collectives"]["all_to_all"] == {"count": 2 * 5, "bytes": 2 * (4 * 8 + 4 * rows)}


def test_latent_attention_and_shared_experts_split_over_tensor_ranks():
    """DeepSeek's blocks with TP 2 (Megatron-Core's split, sequence parallel) and ZeRO-1 over
    the 2 data-parallel ranks, no expert parallelism: each rank's fp32 parameters counted by
    hand. Per block's latent attention: wq 4 heads x (32 + 16) x 128 and wkv_b 4 x (32 + 32) x
    64 split by heads, wo 128 x 128 by its input, wkv_a (64 + 16) x 128 and kv_norm 64 whole;
    block 0's SwiGLU 3 x 256 x 128 split; blocks 1-2: the router 4 x 128 whole, 4 experts of 3 x
    64 x 128 and the shared experts' SwiGLU (2 x 64 wide) 3 x 128 x 128 split; norms whole
    (2 a block and the final one, 128); embedding and output 512 x 128 split by vocabulary."""
    result = CliRunner().invoke(cli, [*DEEPSEEK, "--tp", "2", "--data", "zero1", "--ep", "1", "--json"])
    assert result.exit_code == 0, result.output
    layout = json.loads(result.output)["ranked"][0]
    assert layout["execution"]["tensor"] == 2 and layout["execution"]["sequence_parallel"]
    attention = (4 * 48 * 128 + 4 * 64 * 64 + 128 * 128) // 2 + 80 * 128 + 64
    dense = 3 * 256 * 128 // 2
    moe = 4 * 128 + (4 * 3 * 64 * 128 + 3 * 128 * 128) // 2
    norms = 2 * 128 * 3 + 128
    vocabulary = 2 * 512 * 128 // 2
    assert layout["per_rank_state_bytes"]["parameters"] == 4 * (3 * attention + dense + 2 * moe + norms + vocabulary)


def test_more_leading_dense_blocks_than_a_shallow_trace_holds_is_one_line():
    """A deep stack is planned from traces of 3 and 4 blocks: with 4 dense blocks first, neither
    would hold an expert block."""
    result = CliRunner().invoke(cli, [*DEEPSEEK, "-O", "n_layer=8", "-O", "n_dense_layers=4", "--ep", "auto"])
    assert result.exit_code == 2, result.output
    assert "n_dense_layers=4" in result.output and len(result.output.strip().splitlines()) == 1


def test_tokens_per_step_is_a_global_batch_of_whole_sequences():
    base = ["plan", "gpt2", "-O", "n_layer=2", "--seq", "128", "--amp", "bf16", "--gpu", "h100", "--gpus", "8",
            "--tp", "1", "--pp", "1", "--json"]
    result = CliRunner().invoke(cli, [*base, "--tokens-per-step", str(16 * 128)])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["global_batch"] == 16 and doc["seq_len"] == 128
    assert "seq_len = 128" in doc["torchtitan"]
    bad = CliRunner().invoke(cli, [*base, "--tokens-per-step", "1000"])
    assert bad.exit_code == 2 and "nearest: 896 or 1024" in bad.output
    both = CliRunner().invoke(cli, [*base, "--tokens-per-step", "2048", "--global-batch", "16"])
    assert both.exit_code == 2 and "give one of them" in both.output


def test_batch_and_global_batch_together_are_refused_not_ignored():
    result = CliRunner().invoke(cli, [*ARGS, "--gpus", "8", "--global-batch", "64"])
    assert result.exit_code == 2 and "--batch 2 with --global-batch 64" in result.output


def test_a_bad_layer_count_is_named():
    result = CliRunner().invoke(cli, ["plan", "gpt2", "-O", "n_layer=0", "--gpus", "8"])
    assert result.exit_code == 2 and "n_layer must be at least 1, got 0" in result.output


def test_the_default_global_batch_is_the_models_default_batch_per_gpu():
    """gpt2's default batch is 8 (nnperf models): 8 GPUs make a global batch of 64; the plan
    reports the default sequence it ran (1024) and writes it for torchtitan."""
    result = CliRunner().invoke(cli, ["plan", "gpt2", "-O", "n_layer=2", "--amp", "bf16", "--gpus", "8",
                                      "--tp", "1", "--pp", "1", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["global_batch"] == 64 and doc["seq_len"] == 1024
    assert "seq_len = 1024" in doc["torchtitan"]


def test_each_engine_gets_the_fastest_layout_it_can_run():
    """Megatron-LM has no per-op recomputation: when the winner uses torchtitan's per-op policy,
    Megatron's arguments are the next layout's (full recomputation, 10% slower), saying which and
    why; torchtitan runs the winner itself; DeepSpeed's JSON holds no checkpointing, so no layout
    here, and the winner's reason is given."""
    from types import SimpleNamespace

    from nnperf.cli.plan import engine_configs
    from nnperf.layout import Execution
    from nnperf.search.plan import Planned
    from nnperf.trace.options import TraceOptions

    winner = Execution(world=8, data="fsdp", shard=8, checkpoint="selective-op", micro_batch=1)
    second = Execution(world=8, data="fsdp", shard=8, checkpoint="full", micro_batch=2)
    result = SimpleNamespace(model="llama-7b", layers=32, seq_len=2048,
                             ranked=[Planned(winner, step_s=1.0), Planned(second, step_s=1.1)])
    configs = engine_configs(result, TraceOptions(amp="bf16"))
    assert 'selective_ac_option = "op"' in configs["torchtitan"] and "torchtitan_layout" not in configs
    assert "--recompute-granularity full" in configs["megatron"]
    assert configs["megatron_layout"]["rank"] == 2 and abs(configs["megatron_layout"]["slower_by"] - 0.1) < 1e-9
    assert "per-op" in configs["megatron_not_expressible"]
    assert configs["deepspeed"] is None and "model code" in configs["deepspeed_not_expressible"]


def test_the_data_engines_and_checkpointing_can_be_pinned():
    """--data fsdp,hsdp leaves DDP out (a layout without data parallelism has no engine to pin
    and may stay); --checkpoint full is the only level the search uses; a name that is not one
    of them is one line with the valid ones."""
    result = CliRunner().invoke(cli, [*ARGS, "--gpus", "16", "--tp", "1", "--pp", "1", "--data", "fsdp,hsdp",
                                      "--checkpoint", "full", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    searched = doc["ranked"] + doc["rejected"]
    assert {r["execution"]["data"] for r in doc["ranked"]} == {"fsdp", "hsdp"}
    assert {r["execution"]["checkpoint"] for r in searched} == {"full"}
    # the JSON says what was searched
    assert doc["search"]["data"] == ["fsdp", "hsdp"] and doc["search"]["checkpoint"] == ["full"]
    assert (doc["search"]["tensor"], doc["search"]["pipeline"]) == ([1], [1])
    for option, value in (("--data", "zero3"), ("--checkpoint", "sometimes")):
        bad = CliRunner().invoke(cli, [*ARGS, "--gpus", "8", option, value])
        assert bad.exit_code == 2 and len(bad.output.strip().splitlines()) == 1, bad.output
        assert f"invalid {option} '{value}': expected auto or a list of" in bad.output


def test_the_selective_level_is_each_engines_own_policy():
    """--checkpoint selective: ZeRO-1 (only Megatron-LM runs it) recomputes Megatron-LM's core
    attention, FSDP torchtitan's per-op policy; the JSON names the level as asked."""
    result = CliRunner().invoke(cli, [*ARGS, "--gpus", "4", "--tp", "2", "--pp", "1", "--data", "zero1,fsdp",
                                      "--checkpoint", "selective", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    policies = {(r["execution"]["data"], r["execution"]["checkpoint"]) for r in doc["ranked"] + doc["rejected"]}
    assert policies == {("zero1", "selective-attention"), ("fsdp", "selective-op")}
    assert doc["search"]["checkpoint"] == ["selective"]


def test_fsdp_without_reshard_after_forward_is_ranked_on_request():
    """--reshard always,never ranks FSDP2 both ways: kept after forward, each block's parameters
    are not gathered again in backward (2 blocks: 2 all-gathers fewer); between steps both hold
    the same shards. A value that is neither is one line."""
    result = CliRunner().invoke(cli, [*ARGS, "--gpus", "8", "--tp", "1", "--pp", "1", "--data", "fsdp",
                                      "--reshard", "always,never", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    by = {r["execution"]["reshard_after_forward"]: r for r in doc["ranked"]}
    assert set(by) == {True, False}
    assert by[True]["collectives"]["all_gather"]["count"] - by[False]["collectives"]["all_gather"]["count"] == 2
    assert by[False]["per_rank_state_bytes"] == by[True]["per_rank_state_bytes"]  # sharded at rest both ways
    bad = CliRunner().invoke(cli, [*ARGS, "--gpus", "8", "--reshard", "sometimes"])
    assert bad.exit_code == 2 and "invalid --reshard 'sometimes': expected a list of always, never" in bad.output


def test_output_file_holds_the_json_document_written_atomically(tmp_path):
    path = tmp_path / "plan.json"
    args = [*ARGS, "--gpus", "2", "--tp", "1", "--pp", "1", "--data", "fsdp", "--checkpoint", "none"]
    result = CliRunner().invoke(cli, [*args, "--json", "-o", str(path)])
    assert result.exit_code == 0, result.output
    assert json.loads(path.read_text()) == json.loads(result.output)
    assert not [p for p in tmp_path.iterdir() if p != path]  # no temporary file left behind
    missing = CliRunner().invoke(cli, [*args, "-o", str(tmp_path / "no" / "plan.json")])
    assert missing.exit_code == 2 and "does not exist; create it first" in missing.output


FACTORY = '''
import torch
from torch import nn


def build(batch=4):
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8)), (torch.randn(batch, 64),)
'''


def test_a_model_without_per_family_plans_says_why_tensor_and_pipelines_are_left_out(tmp_path):
    """An hf: model (or any model but the built-in gpt2, llama, bert) is planned with data
    parallelism only; the text used to be silent about it (only the JSON's search field showed it)."""
    model = tmp_path / "tiny.py"
    model.write_text(FACTORY)
    base = ["plan", f"{model}:build", "--gpu", "h100", "--gpus", "2", "--checkpoint", "none"]
    result = CliRunner().invoke(cli, base)
    assert result.exit_code == 0, result.output
    note = next(line for line in result.output.splitlines() if line.startswith("note: tensor and pipeline"))
    assert "need nnperf's per-family plans" in note and f"{model}:build is not one" in note
    refused = CliRunner().invoke(cli, [*base, "--tp", "2"])
    assert refused.exit_code == 2 and "--tp 2: tensor and pipeline parallelism need" in refused.output
    assert len(refused.output.strip().splitlines()) == 1


def test_an_uneven_split_is_planned_with_the_schedules_that_hold_it():
    """10 blocks over 4 stages with end stages of 2: 1F1B holds them (2, 3, 3, 2); two chunks per
    rank cannot (the 6 blocks between over 4 chunks). Asked for with both schedules, the plan runs
    1F1B only (it used to refuse, checking one schedule's split) and says why the interleaved
    one is missing; with the interleaved schedule alone, or its chunks asked for (--vpp 2, the
    default count, given), it is refused in one line."""
    uneven = ["--gpus", "8", "-O", "n_layer=10", "--pp", "4", "--tp", "1", "--data", "fsdp",
              "--first-stage-layers", "2", "--last-stage-layers", "2"]
    result = CliRunner().invoke(cli, [*ARGS, *uneven, "--schedule", "1f1b", "--schedule", "interleaved-1f1b",
                                      "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    planned = [r["execution"] for r in doc["ranked"]]
    assert planned and all((e["pipeline"], e["pipeline_schedule"], e["first_stage_layers"], e["last_stage_layers"])
                           == (4, "1f1b", 2, 2) for e in planned)
    assert any(n.startswith("interleaved schedules left out at pipeline degree 4: 2 chunks a rank cannot split 10 "
                            "layers with first stage 2, last stage 2") for n in doc["notes"]), doc["notes"]
    for asked in (["--schedule", "interleaved-1f1b"], ["--vpp", "2"]):
        result = CliRunner().invoke(cli, [*ARGS, *uneven, *asked])
        assert result.exit_code == 2, result.output
        assert "cannot hold 10 layers in 4 pipeline stages x 2 virtual stages" in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1


def test_an_end_stage_of_one_block_fewer_than_its_chunks():
    """Llama 3 405B's split in small: 6 blocks, 4 stages x 2 chunks, end stages of 1 block, so
    the model's first chunk is the embedding alone and its last the head alone; planned (it was
    refused as a chunk without a block), and Megatron-LM's layout string says so."""
    args = [*ARGS, "--gpus", "8", "-O", "n_layer=6", "--pp", "4", "--vpp", "2", "--tp", "1", "--data", "zero1",
            "--schedule", "interleaved-1f1b", "--first-stage-layers", "1", "--last-stage-layers", "1"]
    result = CliRunner().invoke(cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    planned = [r["execution"] for r in json.loads(result.output)["ranked"]]
    assert planned and all((e["pipeline"], e["virtual_stages"], e["first_stage_layers"], e["last_stage_layers"])
                           == (4, 2, 1, 1) for e in planned)
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert '--pipeline-model-parallel-layout "E|(t*1|)*6,L"' in result.output


def _without_and_with(args: list[str], flag: str) -> tuple[dict, dict]:
    """The JSON plans of ``args`` without and with ``flag``."""
    docs = []
    for extra in ([], [flag]):
        result = CliRunner().invoke(cli, [*args, *extra])
        assert result.exit_code == 0, result.output
        docs.append(json.loads(result.output))
    return docs[0], docs[1]


def _tensor_parallel_exposed(row: dict) -> float:
    """A ranked layout's exposed all-gathers and reduce-scatters."""
    exposed = row["time_split_s"]["exposed_communication_s"]
    return exposed.get("all_gather", 0.0) + exposed.get("reduce_scatter", 0.0)


def test_megatron_layouts_with_tp_comm_overlap():
    """--tp-comm-overlap: ZeRO-1 beside TP 2 with sequence parallelism runs Megatron-LM's
    --tp-comm-overlap (the JSON says so), its block collectives beside their GEMMs: less
    exposed than without, the same collectives."""
    args = ["plan", "gpt2", "-O", "n_layer=4", "-O", "n_head=16", "-O", "n_embd=2048", "--batch", "8", "--seq",
            "1024", "--amp", "bf16", "--gpu", "h100", "--gpus", "8", "--tp", "2", "--pp", "1", "--data", "zero1",
            "--json"]
    plain, overlapped = _without_and_with(args, "--tp-comm-overlap")
    assert overlapped["search"]["tp_comm_overlap"] and not plain["search"]["tp_comm_overlap"]
    sequence_parallel = [r for r in overlapped["ranked"] if r["execution"]["sequence_parallel"]]
    assert sequence_parallel and all(r["execution"]["tp_comm_overlap"] for r in sequence_parallel)
    assert not any(r["execution"]["tp_comm_overlap"] for r in overlapped["ranked"] if not r["execution"]["sequence_parallel"])

    def tensor_parallel_exposed(doc, execution):
        row = next(r for r in doc["ranked"] + doc["rejected"]
                   if {**r["execution"], "tp_comm_overlap": False} == {**execution, "tp_comm_overlap": False})
        return row, _tensor_parallel_exposed(row)

    first = sequence_parallel[0]["execution"]
    with_overlap, hidden = tensor_parallel_exposed(overlapped, first)
    without, shown = tensor_parallel_exposed(plain, first)
    assert hidden < shown and with_overlap["collectives"] == without["collectives"]


def test_tp_comm_overlap_with_context_parallelism_and_no_data_parallel_ranks():
    """TP 2 x CP 2 on 4 GPUs has no data-parallel ranks: Megatron-LM's layout (DDP over the
    context ranks) with --tp-comm-overlap is planned, not refused halfway through the search."""
    result = CliRunner().invoke(cli, ["plan", "gpt2", "-O", "n_layer=2", "-O", "n_head=4", "-O", "n_embd=128",
                                      "--batch", "4", "--seq", "256", "--gpu", "h100", "--gpus", "4", "--tp", "2",
                                      "--cp", "2", "--pp", "1", "--tp-comm-overlap", "--json"])
    assert result.exit_code == 0, result.output
    ranked = [r["execution"] for r in json.loads(result.output)["ranked"]]
    assert any(e["context"] == 2 and e["tp_comm_overlap"] for e in ranked)


def test_a_pipeline_searches_smaller_micro_batches_while_they_are_faster():
    """4 stages of 1F1B, 8 samples a rank: micro-batches of 2 fit, but 4 of them leave 3 of 7
    slots per stage idle, where 8 micro-batches of 1 leave 3 of 11; on a compute-bound model
    the smaller one wins (about 11/14 of the step), and the search must time it, not stop at
    the largest micro-batch that fits."""
    result = CliRunner().invoke(cli, ["plan", "llama-7b", "-O", "n_layer=8", "-O", "dim=4096", "-O", "n_heads=32",
                                      "-O", "n_kv_heads=8", "-O", "ffn_hidden=14336", "--seq", "4096", "--global-batch",
                                      "8", "--dtype", "bf16", "--gpu", "h100", "--gpus", "4", "--tp", "1", "--pp", "4",
                                      "--schedule", "1f1b", "--checkpoint", "none", "--json"])
    assert result.exit_code == 0, result.output
    ranked = json.loads(result.output)["ranked"]
    assert [r["execution"]["micro_batch"] for r in ranked] == [1, 2]
    assert ranked[0]["pipeline"]["bubble_fraction"] < ranked[1]["pipeline"]["bubble_fraction"]



def test_the_micro_batch_can_be_pinned_as_megatron_lms_micro_batch_size():
    """6 stages of 1F1B with 16 samples a rank: --micro-batch 2 ranks only the layouts of 8
    micro-batches of 2 (8 is no multiple of the 6 stages, and 1F1B runs it, as Megatron-LM and
    DeepSpeed do); a size no count of at least one micro-batch per stage can make (16 samples:
    4 would be 4 micro-batches on 6 stages) is one line naming the sizes the layouts run (2 and
    1); 0 is refused."""
    args = ["plan", "gpt2", "-O", "n_layer=6", "--seq", "128", "--amp", "bf16", "--gpu", "h100", "--global-batch",
            "16", "--gpus", "6", "--tp", "1", "--pp", "6", "--schedule", "1f1b", "--checkpoint", "none"]
    result = CliRunner().invoke(cli, [*args, "--micro-batch", "2", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert {(r["execution"]["micro_batch"], r["execution"]["grad_accum"]) for r in doc["ranked"]} == {(2, 8)}
    assert doc["search"]["micro_batch"] == [2]
    refused = CliRunner().invoke(cli, [*args, "--micro-batch", "4"])
    assert refused.exit_code == 2 and "--micro-batch 4: no layout of these degrees runs it" in refused.output
    assert refused.output.strip().endswith("sizes they run: 1, 2")
    assert len(refused.output.strip().splitlines()) == 1
    zero = CliRunner().invoke(cli, [*args, "--micro-batch", "0"])
    assert zero.exit_code == 2 and "invalid --micro-batch '0'" in zero.output


def test_published_models_plan_by_name_with_their_familys_plans():
    """bloom-176b is GPT-2's block at BLOOM's shape (here shrunk by -O): it plans with tensor and
    pipeline parallelism as gpt2 does, and its pipelines carry the tied-embedding note; the
    Megatron-LM arguments name the preset's sequence (2048) without --seq."""
    result = CliRunner().invoke(cli, ["plan", "bloom-176b", "-O", "n_layer=4", "-O", "n_embd=128", "-O", "n_head=4",
                                      "-O", "vocab=512", "--dtype", "bf16", "--gpu", "h100", "--gpus", "8",
                                      "--global-batch", "8", "--tp", "2", "--pp", "2", "--schedule", "1f1b",
                                      "--checkpoint", "none", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert {(r["execution"]["tensor"], r["execution"]["pipeline"]) for r in doc["ranked"]} == {(2, 2)}
    assert any("tied embeddings under pipeline parallelism" in n for n in doc["notes"])
    assert "--seq-length 2048" in doc["megatron"]


def test_degrees_a_pinned_micro_batch_leaves_without_layouts_are_said():
    """4 GPUs, 8 sequences: tensor parallelism 2 leaves 2 data-parallel ranks of 4 (micro-batches
    up to 4), tensor 1 four ranks of 2: --micro-batch 4 ranks TP 2 only, and a note says TP 1
    has no layout of that size."""
    result = CliRunner().invoke(cli, ["plan", "gpt2", "-O", "n_layer=2", "--seq", "128", "--amp", "bf16", "--gpu",
                                      "h100", "--global-batch", "8", "--gpus", "4", "--tp", "1,2", "--pp", "1",
                                      "--data", "ddp", "--checkpoint", "none", "--micro-batch", "4", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert {(r["execution"]["tensor"], r["execution"]["micro_batch"]) for r in doc["ranked"]} == {(2, 4)}
    assert "--micro-batch 4: no layout of tensor x pipeline 1 x 1 runs it, so none is ranked" in doc["notes"]


def test_a_pipelined_global_batch_hint_names_batches_that_plan():
    """8 GPUs at PP 4: 2 data-parallel ranks; 5 samples name 8 alone (2 ranks x 4 stages: the
    interleaved schedule runs a multiple of the stages, so not 4, 2 micro-batches a rank); a tensor x pipeline product above the GPUs blames --tp and --pp."""
    args = ["plan", "gpt2", "-O", "n_layer=8", "--seq", "128", "--amp", "bf16", "--gpu", "h100"]
    result = CliRunner().invoke(cli, [*args, "--gpus", "8", "--tp", "1", "--pp", "4", "--global-batch", "5",
                                      "--schedule", "interleaved-1f1b"])
    assert result.exit_code == 2 and result.output.strip().endswith(
        "the global batch 5 does not divide over the 2 data-parallel ranks (8 GPUs / (tp 1 x pp 4)); try "
        "--global-batch 8"), result.output
    result = CliRunner().invoke(cli, [*args, "--gpus", "8", "--tp", "4", "--pp", "4"])
    assert result.exit_code == 2 and result.output.strip().endswith(
        "--tp 4 x --pp 4 = 16 does not divide the 8 GPUs; pipeline degrees with --tp 4: 1, 2"), result.output


def test_sequence_parallelism_pinned_either_way():
    """--no-sequence-parallel ranks tensor-parallel layouts without it only (Megatron-LM before
    2022), --sequence-parallel with it only; with --tp-comm-overlap, which needs it, one line."""
    base = [*ARGS, "--gpus", "8", "--tp", "2", "--pp", "1", "--json"]
    for flag, expected in (("--no-sequence-parallel", {False}), ("--sequence-parallel", {True})):
        result = CliRunner().invoke(cli, [*base, flag])
        assert result.exit_code == 0, result.output
        ranked = json.loads(result.output)["ranked"]
        assert ranked and {r["execution"]["sequence_parallel"] for r in ranked} == expected
    result = CliRunner().invoke(cli, [*ARGS, "--gpus", "8", "--tp", "2", "--no-sequence-parallel", "--tp-comm-overlap"])
    assert result.exit_code == 2 and "--tp-comm-overlap overlaps sequence parallelism's collectives" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_no_sequence_parallelism_for_experts_split_over_tensor_ranks_is_one_line():
    """Megatron-Core runs a mixture of experts with tensor parallelism only with sequence
    parallelism: pinned off with --tp 2, one line naming both ways out."""
    moe = ["plan", "llama-7b", "-O", "n_layer=2", "-O", "dim=64", "-O", "n_heads=4", "-O", "n_kv_heads=4",
           "-O", "ffn_hidden=128", "-O", "vocab=128", "-O", "n_experts=4", "--seq", "64", "--amp", "bf16",
           "--gpu", "h100", "--gpus", "8", "--pp", "1"]
    result = CliRunner().invoke(cli, [*moe, "--tp", "2", "--no-sequence-parallel"])
    assert result.exit_code == 2 and result.output.strip().endswith(
        "give --tp 1, or drop --no-sequence-parallel"), result.output
    assert len(result.output.strip().splitlines()) == 1


def test_megatron_layouts_with_its_fused_cross_entropy():
    """--cross-entropy-loss-fusion: Megatron-LM's data parallelism runs Megatron-Core's fused loss
    (the JSON and its arguments say so); an engine list without Megatron-LM's, or another loss
    mode beside it, is one line."""
    args = ["plan", "gpt2", "-O", "n_layer=2", "-O", "n_head=4", "-O", "n_embd=128", "--batch", "4", "--seq", "256",
            "--gpu", "h100", "--gpus", "4", "--tp", "1", "--pp", "1"]
    result = CliRunner().invoke(cli, [*args, "--data", "zero1", "--cross-entropy-loss-fusion", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["search"]["loss_fusion"] and all(r["execution"]["loss_fusion"] for r in doc["ranked"])
    assert "--cross-entropy-loss-fusion" in doc["megatron"]
    for extra, named in ((["--data", "fsdp"], "--data fsdp"), (["--loss", "compiled"], "--loss compiled")):
        result = CliRunner().invoke(cli, [*args, *extra, "--cross-entropy-loss-fusion"])
        assert result.exit_code == 2, result.output
        assert "--cross-entropy-loss-fusion" in result.output and named in result.output
        assert len(result.output.strip().splitlines()) == 1


def test_optimizer_states_shrink_zero1s_state_and_name_their_arguments():
    """--optimizer-states on a bf16 model's ZeRO-1 layout over 8 GPUs: the optimizer state per
    element of a share is 12 bytes (fp32 main parameter and moments), 8 (bf16 moments) or 4
    (bf16 moments, no main copy), the parameters and gradients unchanged; Megatron-LM's
    arguments ask for the precision-aware optimizer where it has one and say where it has none."""
    def planned(states: str) -> dict:
        args = [a if a != "--amp" else "--dtype" for a in ARGS]
        result = CliRunner().invoke(cli, [*args, "--gpus", "8", "--tp", "1", "--pp", "1", "--data", "zero1",
                                          "--micro-batch", "2", "--checkpoint", "none", "--optimizer-states", states,
                                          "--json"])
        assert result.exit_code == 0, result.output
        return json.loads(result.output)

    docs = {states: planned(states) for states in ("fp32", "bf16-moments", "bf16")}
    state = {k: d["ranked"][0]["per_rank_state_bytes"] for k, d in docs.items()}
    assert state["fp32"]["parameters"] == state["bf16"]["parameters"] == state["bf16-moments"]["parameters"]
    # what differs is bytes per element of the same shares: 12 - 8 = 4 and 12 - 4 = 8
    shed = state["fp32"]["optimizer_state"] - state["bf16-moments"]["optimizer_state"]
    assert state["fp32"]["optimizer_state"] - state["bf16"]["optimizer_state"] == 2 * shed
    elements = state["fp32"]["parameters"] // 2  # bf16 weights
    assert elements // 8 * 4 <= shed <= (elements // 8 + 64) * 4  # a share each, odd tails on every rank
    assert docs["bf16-moments"]["ranked"][0]["execution"]["optimizer_states"] == "bf16-moments"
    assert "--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16" in docs["bf16-moments"]["megatron"]
    assert "--use-precision-aware-optimizer" not in docs["fp32"]["megatron"]
    assert docs["bf16"]["megatron"] is None
    assert "Apex's DistributedFusedAdam" in docs["bf16"]["megatron_not_expressible"]


def _refused_in_one_line(args: list[str], message: str) -> None:
    """Bad input: exit status 2 and one line with ``message``, no traceback."""
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_optimizer_states_a_layout_cannot_keep_are_one_line():
    for args, message in ((["--optimizer-states", "bf16"], "--optimizer-states bf16 updates the model's own "
                           "parameters, in bf16: it needs --dtype bf16 (not --amp bf16)"),
                          (["--optimizer-states", "bf16-moments", "--data", "fsdp"], "--optimizer-states "
                           "bf16-moments is a distributed optimizer's, which runs as zero1: --data fsdp has none"),
                          (["--optimizer-states", "bf16-moments", "--optimizer", "sgd"], "it needs --optimizer "
                           "adamw or adam, not sgd")):
        _refused_in_one_line([*ARGS, "--gpus", "8", *args], message)


def test_fp32_main_gradients_double_zero1s_reduction_and_keep_megatrons_default():
    """--grad-reduce-in-fp32 on a bf16 model planned as DDP and ZeRO-1 on 8 GPUs: the ZeRO-1
    layout holds an fp32 buffer of its gradients (4 bytes an element: twice the bf16 parameters'
    bytes, where DDP's bf16 buckets held as many) and reduce-scatters it (the data-parallel
    reduce-scatters carry twice the parameters' bf16 bytes, less the odd tails all-reduced); DDP's
    layouts are left as they are; Megatron-LM's arguments drop --grad-reduce-in-bf16 and the
    plan says what the memory counts."""
    def planned(*extra: str) -> dict:
        args = [a if a != "--amp" else "--dtype" for a in ARGS]
        result = CliRunner().invoke(cli, [*args, "--gpus", "8", "--tp", "1", "--pp", "1", "--data", "ddp,zero1",
                                          "--micro-batch", "2", "--checkpoint", "none", *extra, "--json"])
        assert result.exit_code == 0, result.output
        return json.loads(result.output)

    plain, fp32 = planned(), planned("--grad-reduce-in-fp32")

    def layout(doc: dict, data: str) -> dict:
        return next(p for p in doc["ranked"] if p["execution"]["data"] == data)

    parameters = layout(plain, "zero1")["per_rank_state_bytes"]["parameters"]
    assert layout(plain, "zero1")["per_rank_state_bytes"]["gradients"] == parameters
    assert layout(fp32, "zero1")["per_rank_state_bytes"]["gradients"] == 2 * parameters
    assert layout(fp32, "zero1")["execution"]["grad_reduce_in_fp32"] is True
    assert layout(fp32, "ddp")["execution"]["grad_reduce_in_fp32"] is False
    assert layout(fp32, "ddp")["per_rank_state_bytes"] == layout(plain, "ddp")["per_rank_state_bytes"]
    scattered = layout(fp32, "zero1")["collectives"]["reduce_scatter"]["bytes"]
    assert 2 * parameters - 8 * 4 * 64 <= scattered <= 2 * parameters
    assert scattered == 2 * layout(plain, "zero1")["collectives"]["reduce_scatter"]["bytes"]
    zero1_first = fp32["ranked"][0]["execution"]["data"] == "zero1"
    assert ("--grad-reduce-in-bf16" in fp32["megatron"]) is not zero1_first
    assert any("held in fp32 (4 bytes a parameter) and reduce-scattered in fp32" in n for n in fp32["notes"])
    assert not any("fp32 main gradients" in n for n in plain["notes"])


def test_fp32_main_gradients_narrow_the_default_search_to_zero1_and_say_so():
    """Only ZeRO-1 keeps fp32 main gradients: the default search with --grad-reduce-in-fp32 ranks
    ZeRO-1 layouts alone (not DDP, FSDP or HSDP ones reducing in bf16) and says so; a layout
    without data parallelism (TP 2 on 2 GPUs) reduces nothing, which a note says too."""
    args = [a if a != "--amp" else "--dtype" for a in ARGS]
    result = CliRunner().invoke(cli, [*args, "--gpus", "8", "--tp", "1", "--pp", "1", "--micro-batch", "2",
                                      "--checkpoint", "none", "--grad-reduce-in-fp32", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert {p["execution"]["data"] for p in doc["ranked"]} == {"zero1"}
    assert all(p["execution"]["grad_reduce_in_fp32"] for p in doc["ranked"])
    assert any("ZeRO-1 layouts only" in n for n in doc["notes"])
    alone = CliRunner().invoke(cli, [*args, "--gpus", "2", "--tp", "2", "--pp", "1", "--checkpoint", "none",
                                     "--grad-reduce-in-fp32", "--json"])
    assert alone.exit_code == 0, alone.output
    assert any("without data parallelism reduce no gradients: they keep them in bf16" in n
               for n in json.loads(alone.output)["notes"])


def test_fp32_main_gradients_a_plan_cannot_keep_are_one_line():
    dtype = [a if a != "--amp" else "--dtype" for a in ARGS]
    for args, message in (
            ([*ARGS], "it needs --dtype bf16 or fp16 (--amp bf16 keeps fp32 weights"),
            ([a if a != "bf16" else "fp64" for a in dtype],
             "it needs --dtype bf16 or fp16 (an fp64 model's gradients are fp64 already)"),
            ([*dtype, "--data", "fsdp"], "--grad-reduce-in-fp32 is Megatron-LM's distributed optimizer's, which "
                                         "runs as zero1: --data fsdp has none"),
            ([*dtype, "--optimizer-states", "bf16"], "--optimizer-states bf16 keeps none: valid: fp32, "
                                                     "bf16-moments")):
        _refused_in_one_line([*args, "--gpus", "8", "--grad-reduce-in-fp32"], message)


def test_a_gpu_no_built_in_cluster_is_made_of_names_the_clusters_to_borrow():
    """torchtitan's Llama 3.1 benchmarks ran H100s at 500 W, which no built-in cluster is made of:
    the refusal names the built-in clusters whose links --cluster can lend, not only a file."""
    result = CliRunner().invoke(cli, ["plan", "gpt2", "-O", "n_layer=2", "--gpus", "8",
                                      "--gpu", "h100-sxm-96gb-500w"])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert "dgx-a100, dgx-b200, dgx-h100, dgx-h200: its links with this GPU" in result.output


def test_options_a_plan_would_leave_unused_are_one_line():
    """--vpp beside one-chunk schedules only, and --moe-load on a model without experts, were run
    and ignored without a word."""
    for extra, message in (
            (["--pp", "2", "--vpp", "2", "--schedule", "1f1b"],
             "--vpp 2 splits each rank's stages into chunks, which --schedule 1f1b does not run"),
            (["--moe-load", "0.5,0.5"], "--moe-load spreads the tokens over a mixture of experts, and the model "
                                        "has no experts")):
        _refused_in_one_line([*ARGS, "--gpus", "8", *extra], message)


def test_a_mixture_of_experts_beside_tensor_parallelism_searches_its_pipelines():
    """The search's pipelines run one engine at every pipeline shape and the others at its best
    one. That engine was FSDP, which no mixture of experts beside tensor parallelism runs: asked
    for pipelines of 1 and 2 stages, the search traced none of 2 and said nothing. Now ZeRO-1
    leads there, and DDP follows at its best shape. The experts split over the tensor ranks (the
    default) come with a note that --etp 1 ranks the layouts keeping them whole; the winner's
    degrees are tried that way too."""
    result = CliRunner().invoke(cli, ["plan", "mixtral-8x7b", "-O", "n_layer=2", "-O", "dim=128", "-O", "n_heads=4",
                                      "-O", "n_kv_heads=2", "-O", "ffn_hidden=256", "-O", "vocab=512", "--seq", "128",
                                      "--global-batch", "16", "--gpus", "8", "--tp", "2", "--pp", "1,2", "--ep", "2",
                                      "--dtype", "bf16", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    piped = {r["execution"]["data"] for r in doc["ranked"] + doc["rejected"] if r["execution"]["pipeline"] == 2}
    assert piped == {"zero1", "ddp"}
    # its experts split over the tensor ranks (the default), and whole at the winner's degrees: the
    # search says so, and that --etp 1 ranks every layout that way
    assert any("plan with --etp 1 to rank every layout so" in n for n in doc["notes"])
    whole = [r for r in doc["ranked"] + doc["rejected"] if r["execution"]["expert_tensor"] == 1]
    assert len(whole) == 1 and "EP x2 (experts whole, folded over TP)" in whole[0]["layout"]


def test_a_layout_without_data_parallelism_is_planned_as_the_framework_named():
    """GPT-2 of 4 blocks on 4 GPUs as TP 2 x PP 2 (1F1B, 8 micro-batches, no data parallelism):
    both frameworks run it. As torch's its stages hold a receive buffer for every micro-batch
    all step (the note says so); as Megatron-LM's each is allocated as it arrives, so the same
    layout holds less, and only that framework's engine arguments come with it."""
    def planned(framework: str) -> dict:
        result = CliRunner().invoke(cli, ["plan", "gpt2", "-O", "n_layer=4", "--seq", "128", "--amp", "bf16",
                                          "--gpu", "h100", "--gpus", "4", "--global-batch", "8", "--tp", "2",
                                          "--pp", "2", "--schedule", "1f1b", "--micro-batch", "1",
                                          "--no-sequence-parallel", "--checkpoint", "none", "--framework",
                                          framework, "--json"])
        assert result.exit_code == 0, result.output
        return json.loads(result.output)

    auto, torch, megatron = planned("auto"), planned("torch"), planned("megatron")
    assert [r["execution"]["framework"] for r in megatron["ranked"]] == ["megatron"]
    assert torch["ranked"][0]["execution"]["framework"] == "torch" and auto["ranked"][0]["execution"]["framework"] is None
    assert megatron["ranked"][0]["layout"].startswith("Megatron-LM: TP x2, PP x2 1f1b")
    assert auto["ranked"][0]["memory_bytes"] == torch["ranked"][0]["memory_bytes"]  # torch's by default
    assert megatron["ranked"][0]["memory_bytes"] < torch["ranked"][0]["memory_bytes"]
    assert any("plan with --framework megatron" in n for n in torch["notes"])
    assert not any("plan with --framework megatron" in n for n in megatron["notes"])
    assert torch["megatron"] is None and "planned as torch runs it" in torch["megatron_not_expressible"]
    assert "--tensor-model-parallel-size 2" in megatron["megatron"]
    assert megatron["torchtitan"] is None
    assert "planned as Megatron-LM runs it" in megatron["torchtitan_not_expressible"]


def test_a_framework_that_runs_none_of_the_asked_layouts_is_one_line():
    for args, message in ((["--framework", "torch", "--data", "zero1"], "--framework torch runs ddp, fsdp, hsdp data "
                           "parallelism: --data zero1 has none of them"),
                          (["--framework", "megatron", "--data", "fsdp,hsdp"], "--framework megatron runs ddp, zero1 "
                           "data parallelism: --data fsdp,hsdp has none of them"),
                          (["--framework", "torch", "--tp", "2", "--tp-comm-overlap"], "--framework torch with "
                           "--tp-comm-overlap: Megatron-LM's own settings; give --framework megatron or auto, or "
                           "drop them"),
                          (["--framework", "jax"], "Invalid value for '--framework': 'jax' is not one of 'auto', "
                           "'megatron', 'torch'")):
        result = CliRunner().invoke(cli, [*ARGS, "--gpus", "8", *args])
        assert result.exit_code == 2, result.output
        assert message in result.output
        assert len([line for line in result.output.splitlines() if line.strip() and "Usage" not in line
                    and "Try" not in line]) == 1


def test_the_text_says_the_hosts_share_of_the_step_and_whose_layout_each_config_is(tmp_path):
    """Each ranked layout is two lines, the second saying the host's time to issue the step and
    its share of the step, from the same figures the JSON gives; the header counts its rank roles in
    words; where torchtitan's configs are the second layout's (it has no ZeRO-1), Megatron-LM's
    arguments say they are the fastest's."""
    args = ["plan", "gpt2", "-O", "n_layer=2", "--seq", "128", "--batch", "2", "--amp", "bf16", "--gpu", "h100",
            "--gpus", "2"]
    result = CliRunner().invoke(cli, [*args, "--output", str(tmp_path / "plan.json")])  # the text, and the JSON
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "plan.json").read_text())
    lines = result.output.splitlines()
    roles = doc["traced_roles"]
    assert lines[0].endswith(f"; {roles} rank role{'' if roles == 1 else 's'} traced")
    for i, planned in enumerate(doc["ranked"], 1):
        at = next(n for n, x in enumerate(lines) if x.startswith(f"{i}. "))
        assert lines[at].endswith(" GiB/GPU") and lines[at + 1].startswith("   compute ")
        line = lines[at + 1]
        host, step = planned["time_split_s"]["host_s"], planned["step_time_s"]
        assert f"host {host * 1e3:.2f} ms to issue it (beside the device, {round(100 * host / step)}% of the step)" \
            in line, line
    assert doc["torchtitan_layout"]["rank"] == 2 and not doc.get("megatron_layout")
    assert "torchtitan config (plan.toml) for #2," in result.output
    assert "Megatron-LM arguments (the layout's; the model's own, --num-layers, --hidden-size and the rest, " \
           "--num-experts and --moe-router-topk for experts, are the run's) for #1, the fastest:" in result.output


def test_asked_chunks_at_searched_pipeline_degrees_leave_out_what_they_cannot_split():
    """--vpp 2 (the default count, given) with the pipeline degree searched: 12 blocks over 4
    stages are 3 a stage, which 2 chunks cannot split, so interleaving is left out there and
    said; the plan still ranks layouts (it used to refuse the whole search)."""
    result = CliRunner().invoke(cli, [*ARGS, "-O", "n_layer=12", "--gpus", "8", "--tp", "1", "--data", "zero1",
                                      "--vpp", "2", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["ranked"]
    assert any(n.startswith("interleaved schedules left out at pipeline degree 4: 2 chunks a rank cannot split 12 "
                            "layers (every chunk") for n in doc["notes"]), doc["notes"]
    assert not any(r["execution"]["pipeline"] == 4 and r["execution"]["virtual_stages"] > 1 for r in doc["ranked"])


def test_torch_layouts_with_async_tp():
    """--async-tp (with the compiled blocks): FSDP x TP 4 with sequence parallelism runs torch's
    async tensor parallelism (the JSON and torchtitan's config say so), its blocks' collectives
    pipelined with their matmuls: less exposed than without, the same collectives, and more
    compute (the reduce-scatters' sums, left to the compute stream)."""
    args = ["plan", "llama-7b", "-O", "n_layer=2", "-O", "dim=4096", "-O", "n_heads=32", "-O", "n_kv_heads=32",
            "-O", "ffn_hidden=11008", "-O", "vocab=1000", "--batch", "4", "--seq", "2048", "--amp", "bf16",
            "--pointwise", "fused", "--gpu", "h100", "--gpus", "8", "--tp", "4", "--pp", "1", "--data", "fsdp",
            "--sequence-parallel", "--checkpoint", "none", "--json"]
    plain, pipelined = _without_and_with(args, "--async-tp")
    assert pipelined["search"]["async_tp"] and not plain["search"]["async_tp"]
    assert pipelined["ranked"] and all(r["execution"]["async_tp"] for r in pipelined["ranked"])
    assert "enable_async_tensor_parallel = true" in pipelined["torchtitan"]

    with_async, without = pipelined["ranked"][0], plain["ranked"][0]
    hidden, shown = _tensor_parallel_exposed(with_async), _tensor_parallel_exposed(without)
    assert {**with_async["execution"], "async_tp": False} == without["execution"]
    assert hidden < shown and with_async["collectives"] == without["collectives"]
    assert with_async["time_split_s"]["compute_s"] > without["time_split_s"]["compute_s"]


@pytest.mark.parametrize(("extra", "words"), [
    (["--tp", "2"], "add --pointwise fused"),
    (["--tp", "2", "--pointwise", "fused", "--framework", "megatron"], "give --framework torch or auto"),
    (["--tp", "2", "--pointwise", "fused", "--no-sequence-parallel"], "it needs sequence parallelism"),
    (["--tp", "1", "--pointwise", "fused"], "give --tp above 1"),
])
def test_async_tp_where_it_cannot_apply_is_one_line(extra, words):
    result = CliRunner().invoke(cli, [*ARGS, "--gpus", "8", "--async-tp", *extra])
    assert result.exit_code == 2 and words in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1


def test_async_tp_beside_megatrons_layouts_only_says_it_applies_to_none():
    result = CliRunner().invoke(cli, [*ARGS, "--gpus", "4", "--tp", "2", "--pp", "1", "--data", "zero1",
                                      "--pointwise", "fused", "--async-tp", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["ranked"] and not any(r["execution"]["async_tp"] for r in doc["ranked"])
    assert any(n.startswith("--async-tp: no layout searched") for n in doc["notes"])
