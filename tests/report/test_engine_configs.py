"""The torchtitan TOML's batch settings: torchtitan accumulates global_batch_size //
(local_batch_size x data-parallel ranks) steps, and splits a pipeline rank's local batch into
micro-batches, so the numbers it must get follow from the layout by hand."""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import pytest

from nnperf.layout import Execution
from nnperf.report.engine_configs import torchtitan_toml

if sys.version_info >= (3, 11):
    import tomllib
else:  # the project's own fallback (nnperf.hardware.schema)
    import tomli as tomllib


def _training(execution: Execution) -> dict:
    return tomllib.loads(torchtitan_toml(execution, amp="bf16"))["training"]


def test_accumulation_keeps_the_micro_batch_as_local_batch():
    e = Execution(world=2, data="fsdp", shard=2, micro_batch=16, grad_accum=2)
    training = _training(e)
    assert training["local_batch_size"] == 16
    assert training["global_batch_size"] == 64
    # what torchtitan derives from them: the plan's accumulation
    assert training["global_batch_size"] // (training["local_batch_size"] * 2) == 2


def test_ddp_accumulating_names_the_reductions_the_plan_left_out():
    """The plan reduces DDP's gradients once per step; the TOML says what a trainer reducing
    every micro-batch adds (3 more of 4), and an FSDP layout or a single micro-batch says none."""
    text = torchtitan_toml(Execution(world=2, data="ddp", micro_batch=4, grad_accum=4), amp="bf16")
    assert "before the last of the 4 micro-batches" in text and "3 reductions more" in text
    for quiet in (Execution(world=2, data="fsdp", shard=2, micro_batch=4, grad_accum=4),
                  Execution(world=2, data="ddp", micro_batch=16)):
        assert "reductions more" not in torchtitan_toml(quiet, amp="bf16")


def test_a_pipeline_rank_feeds_all_its_micro_batches_as_its_local_batch():
    e = Execution(world=4, data="fsdp", shard=2, pipeline=2, pipeline_schedule="1f1b", micro_batch=2,
                  grad_accum=4)
    parsed = tomllib.loads(torchtitan_toml(e, amp="bf16"))
    assert parsed["training"]["local_batch_size"] == 8
    assert parsed["parallelism"]["pipeline_parallel_microbatch_size"] == 2


def test_expert_parallelism_is_torchtitans_degree_and_no_other_engines_json():
    import pytest

    from nnperf.report.engine_configs import NotExpressible, deepspeed_json, megatron_args

    e = Execution(world=8, data="fsdp", shard=8, expert=4)
    parallelism = tomllib.loads(torchtitan_toml(e, amp="bf16"))["parallelism"]
    assert parallelism["expert_parallel_degree"] == 4
    assert parallelism["data_parallel_shard_degree"] == 8  # torchtitan carves EP out of dp_shard
    with pytest.raises(NotExpressible, match="model code"):
        deepspeed_json(e, amp="bf16")
    with pytest.raises(NotExpressible, match="FSDP2"):
        megatron_args(e, 4, amp="bf16")


def test_expert_parallelism_with_ddp_or_zero1_is_megatrons_and_not_torchtitans():
    """Megatron-LM carves --expert-model-parallel-size out of its data-parallel ranks (DDP or the
    distributed optimizer); torchtitan only out of the FSDP shard group."""
    import pytest

    from nnperf.report.engine_configs import NotExpressible, megatron_args, torchtitan_refusals

    e = Execution(world=16, data="zero1", pipeline=2, pipeline_schedule="1f1b", grad_accum=4, expert=4)
    args = megatron_args(e, 4, amp="bf16")
    assert "--expert-model-parallel-size 4" in args and "--use-distributed-optimizer" in args
    assert "--moe-token-dispatcher-type alltoall" in args  # as planned; Megatron-LM's default is allgather
    assert "--moe-grouped-gemm" in args  # TE's GroupedLinear, as timed; Megatron-Core's default loops
    assert "--expert-model-parallel-size 2" in megatron_args(replace(e, data="ddp", expert=2), 4, amp="bf16")
    assert "--expert-tensor-parallel-size" not in args
    split = megatron_args(replace(e, world=32, tensor=2, sequence_parallel=True), 4, amp="bf16")
    assert "--expert-tensor-parallel-size 2" in split  # each expert split as the dense layers
    with pytest.raises(NotExpressible, match="out of DDP's replicas"):
        torchtitan_refusals(replace(e, data="ddp"), "bf16", None, "flash")


def test_the_expert_overlap_is_megatron_cores_alone():
    import pytest

    from nnperf.report.engine_configs import (
        NotExpressible,
        megatron_args,
        megatron_deepspeed_args,
        torchtitan_refusals,
    )

    e = Execution(world=16, data="zero1", expert=8, grad_accum=4, expert_overlap=True)
    assert "--overlap-moe-expert-parallel-comm \\\n" in megatron_args(e, 4, amp="bf16")
    assert "launch with CUDA_DEVICE_MAX_CONNECTIONS=32" in megatron_args(e, 4, amp="bf16")
    assert "--overlap-moe-expert-parallel-comm" not in megatron_args(replace(e, expert_overlap=False), 4, amp="bf16")
    with pytest.raises(NotExpressible, match="--overlap-moe-expert-parallel-comm"):
        torchtitan_refusals(e, "bf16", None, "flash")
    with pytest.raises(NotExpressible, match="Megatron-Core's, not Megatron-DeepSpeed's"):
        megatron_deepspeed_args(replace(e, data="ddp"), amp="bf16")
    # Megatron-Core's TransformerConfig asserts a bf16 or fp16 model beside the overlap
    assert "--overlap-moe-expert-parallel-comm" in megatron_args(e, 4, dtype="fp16")
    for fp32 in ({}, {"dtype": "fp32"}):
        with pytest.raises(NotExpressible, match="bf16 or fp16 model only"):
            megatron_args(e, 4, **fp32)


def test_megatrons_context_parallelism_runs_the_all_gather_scheme_the_plan_times():
    """search.plan.context times keys and values all-gathered over the context ranks; Megatron-LM's
    default --cp-comm-type is its p2p ring, so the arguments name the all-gather scheme, by the
    string Transformer Engine's attn_forward_func_with_cp branches on ("all_gather"; any other
    raises "Unsupported communication type")."""
    from nnperf.report.engine_configs import megatron_args

    e = Execution(world=8, data="zero1", tensor=2, sequence_parallel=True, context=2, grad_accum=2)
    args = megatron_args(e, 4, amp="bf16")
    assert "--context-parallel-size 2 \\\n" in args and "--cp-comm-type all_gather \\\n" in args
    assert "--cp-comm-type" not in megatron_args(replace(e, context=1, world=4), 4, amp="bf16")


def test_a_compiled_loss_is_torchtitans_compile_of_the_loss_component_only():
    e = Execution(world=8, data="fsdp", shard=8, micro_batch=2)
    compiled = tomllib.loads(torchtitan_toml(e, amp="bf16", loss="compiled"))["compile"]
    # torchtitan compiles the components listed (CompileConfig.components; "model" would also
    # compile every block, which the plan did not assume)
    assert compiled == {"enable": True, "components": ["loss"]}
    assert "compile" not in tomllib.loads(torchtitan_toml(e, amp="bf16"))


def test_a_chunked_loss_is_named_in_a_comment_torchtitan_has_no_key_for_it():
    e = Execution(world=8, data="fsdp", shard=8, micro_batch=2)
    text = torchtitan_toml(e, amp="bf16", loss="chunked")
    assert "ChunkedLossWrapper.Config(num_chunks=8)" in text
    assert tomllib.loads(text) == tomllib.loads(torchtitan_toml(e, amp="bf16"))  # nothing else changes


def test_the_toml_states_the_precision_torchtitan_would_otherwise_default():
    """torchtitan's mixed_precision_param is Literal["bfloat16", "float32"] defaulting to
    bfloat16 (job_config.py): an fp32 plan must say float32, an fp16 one cannot be written."""
    import pytest

    from nnperf.report.engine_configs import NotExpressible

    e = Execution(world=8, data="fsdp", shard=8, micro_batch=2)
    assert _training(e)["mixed_precision_param"] == "bfloat16"
    assert tomllib.loads(torchtitan_toml(e))["training"]["mixed_precision_param"] == "float32"
    with pytest.raises(NotExpressible, match="bfloat16 or float32"):
        torchtitan_toml(e, amp="fp16")


def test_the_sequence_length_is_written_for_both_engines():
    """torchtitan's seq_len defaults to 2048 and Megatron-LM needs --seq-length: a plan at 8192
    tokens must carry it."""
    from nnperf.report.engine_configs import megatron_args

    e = Execution(world=8, data="fsdp", shard=8, micro_batch=2)
    assert tomllib.loads(torchtitan_toml(e, amp="bf16", seq_len=8192))["training"]["seq_len"] == 8192
    assert "--seq-length 8192" in megatron_args(e, 32, amp="bf16", seq_len=8192).split(" \\\n  ")


def test_each_engine_gets_only_the_checkpointing_policy_it_has():
    """torchtitan: selective_ac_option "op" is its per-op policy (its default "2" would fully
    checkpoint every second block); nnperf's own selective policy is neither engine's;
    Megatron's --recompute-activations is the attention-only policy."""
    import pytest

    from nnperf.report.engine_configs import NotExpressible, megatron_args

    op = Execution(world=8, data="fsdp", shard=8, checkpoint="selective-op")
    ac = tomllib.loads(torchtitan_toml(op, amp="bf16"))["activation_checkpoint"]
    assert ac == {"mode": "selective", "selective_ac_option": "op"}
    ours = Execution(world=8, data="fsdp", shard=8, checkpoint="selective")
    with pytest.raises(NotExpressible, match="selective-op"):
        torchtitan_toml(ours, amp="bf16")
    with pytest.raises(NotExpressible, match="selective-attention"):
        megatron_args(ours, 32, amp="bf16")
    attention = Execution(world=8, data="fsdp", shard=8, checkpoint="selective-attention")
    assert "--recompute-activations" in megatron_args(attention, 32, amp="bf16")


def test_torchtitan_configures_decoder_language_models_only():
    import pytest

    from nnperf.report.engine_configs import NotExpressible, check_torchtitan_model

    check_torchtitan_model("llama-7b")
    check_torchtitan_model("hf:some/causal-lm")  # not a built-in: the user's to judge
    for model, kind in (("resnet50", "cnn"), ("bert-base", "encoder"), ("timm:resnet18", "image")):
        with pytest.raises(NotExpressible, match=kind):
            check_torchtitan_model(model)


def test_clipping_is_each_engines_own_setting_and_torchtitans_default_is_named():
    """torchtitan clips every step (training.max_norm, default 1.0): a plan with clipping sets
    it, one without says the run adds it; the same for Megatron-LM's --clip-grad (default 1.0: a
    plan never turns a user's clipping off). DeepSpeed's gradient_clipping defaults to 0 (off)."""

    from nnperf.report.engine_configs import deepspeed_json, megatron_args

    e = Execution(world=8, data="fsdp", shard=8, micro_batch=2)
    assert tomllib.loads(torchtitan_toml(e, amp="bf16", clip=0.5))["training"]["max_norm"] == 0.5
    unclipped = torchtitan_toml(e, amp="bf16")
    assert "max_norm" not in tomllib.loads(unclipped)["training"]
    assert "# max_norm: torchtitan clips the gradients every step (default 1.0)" in unclipped
    assert "--clip-grad 0.5" in megatron_args(e, 32, amp="bf16", clip=0.5).split("\n#")[0].split(" \\\n  ")
    unclipped_args = megatron_args(e, 32, amp="bf16")  # Megatron's own 1.0 stays, and is named
    assert "--clip-grad" not in unclipped_args.split("\n#")[0]
    assert "\n# --clip-grad: Megatron-LM clips the gradients to 1.0 by default" in unclipped_args
    assert json.loads(deepspeed_json(e, amp="bf16", clip=0.5))["gradient_clipping"] == 0.5
    assert "gradient_clipping" not in json.loads(deepspeed_json(e, amp="bf16"))


def test_fsdp_kept_after_forward_is_torchtitans_never_and_no_deepspeed_stage():
    """torchtitan: fsdp_reshard_after_forward = "never"; Megatron-LM's torch FSDP2 path:
    --torch-fsdp2-no-reshard-after-forward; DeepSpeed's ZeRO-3 always frees them."""
    import pytest

    from nnperf.report.engine_configs import NotExpressible, deepspeed_json, megatron_args

    e = Execution(world=8, data="fsdp", shard=8, micro_batch=2, reshard_after_forward=False)
    assert tomllib.loads(torchtitan_toml(e, amp="bf16"))["parallelism"]["fsdp_reshard_after_forward"] == "never"
    assert "--torch-fsdp2-no-reshard-after-forward" in megatron_args(e, 32, amp="bf16").split(" \\\n  ")
    with pytest.raises(NotExpressible, match="frees gathered parameters after each module's forward"):
        deepspeed_json(e, amp="bf16")


def test_zero1_is_deepspeeds_stage_1_megatrons_distributed_optimizer_and_not_torchtitan():
    """ZeRO-1 (the optimizer state sharded, parameters and gradients whole): DeepSpeed's
    zero_optimization.stage 1; Megatron-LM's distributed optimizer with the overlaps planned
    (gradients reduce-scattered as backward fills a bucket, parameters gathered as the next
    forward starts) and the plan's bucket size; torchtitan has no such data parallelism."""
    import pytest

    from nnperf.report.engine_configs import NotExpressible, deepspeed_json, megatron_args

    e = Execution(world=8, data="zero1", micro_batch=4, grad_accum=2)
    config = json.loads(deepspeed_json(e, amp="bf16"))
    assert config["zero_optimization"]["stage"] == 1
    assert config["train_batch_size"] == 64 == 4 * 2 * 8
    args = megatron_args(e, 32, amp="bf16")
    assert "--use-distributed-optimizer" in args.split("\n#")[0].split(" \\\n  ")
    assert "--use-torch-fsdp2" not in args
    flags = args.split("\n#")[0].split(" \\\n  ")
    assert {"--overlap-grad-reduce", "--overlap-param-gather"} <= set(flags)
    assert f"--ddp-bucket-size {e.bucket_bytes // 4}" in flags  # elements of fp32 main gradients
    with pytest.raises(NotExpressible, match="no ZeRO-1"):
        torchtitan_toml(e, amp="bf16")


def test_megatron_reduces_the_gradients_a_16_bit_model_was_planned_with():
    """A --dtype bf16 plan reduces bf16 gradients: Megatron-LM's --bf16 alone would reduce fp32
    main gradients, so --grad-reduce-in-bf16 is added and the bucket counts 2-byte elements; fp16
    reduces in fp16 by default; an --amp plan's gradients are fp32, as Megatron-LM's default."""
    from nnperf.report.engine_configs import megatron_args

    e = Execution(world=8, data="zero1", micro_batch=4, grad_accum=2)
    for dtype, amp, extra, itemsize in (("bf16", None, True, 2), ("fp16", None, False, 2), (None, "bf16", False, 4),
                                        ("bf16", "bf16", True, 2)):
        flags = megatron_args(e, 32, amp=amp, dtype=dtype).split("\n#")[0].split(" \\\n  ")
        assert ("--grad-reduce-in-bf16" in flags) is extra
        assert f"--ddp-bucket-size {e.bucket_bytes // itemsize}" in flags
    fsdp = megatron_args(Execution(world=8, data="fsdp"), 32, dtype="bf16")
    assert "--grad-reduce-in-bf16" not in fsdp


def test_fp32_main_gradients_are_asked_of_each_engine_as_planned():
    """A ZeRO-1 plan with fp32 main gradients: Megatron-LM's --bf16 keeps them by default (no
    --grad-reduce-in-bf16), its --fp16 is asked (--accumulate-allreduce-grads-in-fp32); the
    bucket still counts the model's 2-byte elements (the buckets are of the same gradients).
    DeepSpeed's BF16_Optimizer, which keeps fp32 gradients, all-reduces them whole (twice the
    planned bytes), and its ZeRO keeps none for fp16: one line each."""
    from nnperf.report.engine_configs import NotExpressible, deepspeed_json, megatron_args

    e = Execution(world=8, data="zero1", micro_batch=4, grad_accum=2, grad_reduce_in_fp32=True)
    bf16 = megatron_args(e, 32, dtype="bf16").split("\n#")[0].split(" \\\n  ")
    assert "--grad-reduce-in-bf16" not in bf16 and "--accumulate-allreduce-grads-in-fp32" not in bf16
    assert f"--ddp-bucket-size {e.bucket_bytes // 2}" in bf16
    fp16 = megatron_args(e, 32, dtype="fp16").split("\n#")[0].split(" \\\n  ")
    assert "--accumulate-allreduce-grads-in-fp32" in fp16 and "--fp16" in fp16
    for dtype in ("bf16", "fp16"):
        with pytest.raises(NotExpressible, match="all-reduces them whole"):
            deepspeed_json(e, dtype=dtype)


def test_deepspeed_without_zero_has_no_bf16_gradient_accumulation():
    """DeepSpeed's engine refuses a bf16 model's bf16 gradient accumulation without ZeRO or a
    pipeline ("Bfloat16 wrapper must use a gradient accumulation type of fp32"): a --dtype bf16
    DDP plan is one line; with a pipeline, or ZeRO-1, or --amp (fp32 gradients), a config."""
    from nnperf.report.engine_configs import NotExpressible, deepspeed_json

    with pytest.raises(NotExpressible, match="without ZeRO accumulates a bf16 model's gradients in fp32"):
        deepspeed_json(Execution(world=8, data="ddp"), dtype="bf16")
    piped = Execution(world=8, data="ddp", pipeline=2, pipeline_schedule="1f1b", grad_accum=2)
    assert json.loads(deepspeed_json(piped, dtype="bf16"))["data_types"] == {"grad_accum_dtype": "bf16"}
    assert json.loads(deepspeed_json(Execution(world=8, data="zero1"), dtype="bf16"))["zero_optimization"]["stage"] == 1
    assert "data_types" not in json.loads(deepspeed_json(Execution(world=8, data="ddp"), amp="bf16"))


def test_megatron_data_parallelism_beside_tensor_and_pipeline_parallelism():
    """DDP beside TP 8 x PP 4 with 3 virtual stages of 60 layers: Megatron-LM's DDP with its
    gradient reduction overlapped, 60 / (4 x 3) = 5 layers per virtual stage."""
    from nnperf.report.engine_configs import megatron_args

    e = Execution(world=128, data="ddp", tensor=8, sequence_parallel=True, pipeline=4,
                  pipeline_schedule="interleaved-1f1b", virtual_stages=3, micro_batch=1, grad_accum=8)
    flags = megatron_args(e, 60, amp="bf16").split("\n#")[0].split(" \\\n  ")
    assert {"--tensor-model-parallel-size 8", "--pipeline-model-parallel-size 4", "--sequence-parallel",
            "--num-layers-per-virtual-pipeline-stage 5", "--overlap-grad-reduce"} <= set(flags)
    assert "--use-distributed-optimizer" not in flags


def test_uneven_stages_in_megatron_and_torchtitan():
    """126 layers over 16 stages with the first and last shortened to 7 (Llama 3 405B): Megatron-
    LM's first/last pipeline stage layers; torchtitan's split of 8 layers a stage, one fewer on
    each end. An even split says torchtitan's default one-fewer is off."""
    import pytest

    from nnperf.report.engine_configs import NotExpressible, megatron_args

    e = Execution(world=128, data="fsdp", shard=8, pipeline=16, pipeline_schedule="1f1b", grad_accum=16,
                  reshard_after_forward=False, first_stage_layers=7, last_stage_layers=7)
    flags = megatron_args(e, 126, amp="bf16").split("\n#")[0].split(" \\\n  ")
    assert {"--decoder-first-pipeline-num-layers 7", "--decoder-last-pipeline-num-layers 7"} <= set(flags)
    parallelism = tomllib.loads(torchtitan_toml(e, amp="bf16", layers=126))["parallelism"]
    assert parallelism["pipeline_parallel_layers_per_stage"] == 8
    assert parallelism["pipeline_parallel_first_stage_less_layers"] == 1
    assert parallelism["pipeline_parallel_last_stage_less_layers"] == 1
    even = tomllib.loads(torchtitan_toml(replace(e, first_stage_layers=None, last_stage_layers=None), amp="bf16",
                                         layers=128))["parallelism"]
    assert even["pipeline_parallel_first_stage_less_layers"] == even["pipeline_parallel_last_stage_less_layers"] == 0
    # interleaved, 2 chunks per rank: 7 blocks do not split evenly over an end stage's chunks,
    # which Megatron-LM's flags require: the layout string, each chunk's blocks in model order
    interleaved = replace(e, pipeline_schedule="interleaved-1f1b", virtual_stages=2)
    flags = megatron_args(interleaved, 126, amp="bf16").split("\n#")[0].split(" \\\n  ")
    layout = next(f for f in flags if f.startswith("--pipeline-model-parallel-layout"))
    assert not any(f.startswith("--decoder-") for f in flags)
    chunks = _unrolled(layout.split(" ", 1)[1].strip('"'))
    assert [c.count("t") for c in chunks] == [3, *[4] * 30, 3]
    assert chunks[0].startswith("E") and chunks[-1].endswith("L") and "".join(chunks).count("E") == 1
    # end stages of 8 blocks over 2 chunks (4 each; 110 between): Megatron-LM's own flags
    even_ends = replace(interleaved, first_stage_layers=8, last_stage_layers=8)
    flags = megatron_args(even_ends, 128, amp="bf16").split("\n#")[0].split(" \\\n  ")
    assert {"--decoder-first-pipeline-num-layers 8", "--decoder-last-pipeline-num-layers 8",
            "--num-virtual-stages-per-pipeline-rank 2"} <= set(flags)
    # torchtitan shortens the model's first and last chunk only: 3 + 4 on rank 0 is that; 2 + 2
    # (20 blocks, 4 stages x 2, end stages of 4, 3 in each chunk between) is not
    parallelism = tomllib.loads(torchtitan_toml(interleaved, amp="bf16", layers=126))["parallelism"]
    assert (parallelism["pipeline_parallel_layers_per_stage"], parallelism["pipeline_parallel_first_stage_less_layers"]) \
        == (4, 1)
    with pytest.raises(NotExpressible, match="module_fqns_per_model_part"):
        torchtitan_toml(replace(interleaved, world=32, pipeline=4, first_stage_layers=4, last_stage_layers=4),
                        amp="bf16", layers=20)
    # as Llama 3 405B ran: 8 chunks of one block a rank, the model's first chunk the embedding
    # alone and its last the loss alone (Megatron-Core's "E" and "L" chunks; torchtitan's one
    # block a stage, one fewer on each end)
    as_ran = replace(e, pipeline_schedule="interleaved-1f1b", virtual_stages=8)
    flags = megatron_args(as_ran, 126, amp="bf16").split("\n#")[0].split(" \\\n  ")
    layout = next(f for f in flags if f.startswith("--pipeline-model-parallel-layout"))
    chunks = _unrolled(layout.split(" ", 1)[1].strip('"'))
    assert chunks[0] == "E" and chunks[-1] == "L" and len(chunks) == 128
    assert all(c.count("t") == 1 for c in chunks[1:-1])
    # one chunk a rank, the first stage the embedding alone: the layout string, not a first
    # stage of 0 layers in --decoder-first-pipeline-num-layers
    alone = replace(e, world=16, pipeline=2, grad_accum=2, first_stage_layers=0, last_stage_layers=None)
    flags = megatron_args(alone, 4, amp="bf16").split("\n#")[0].split(" \\\n  ")
    assert '--pipeline-model-parallel-layout "E|t*4L"' in flags and not any(f.startswith("--decoder-") for f in flags)
    parallelism = tomllib.loads(torchtitan_toml(as_ran, amp="bf16", layers=126))["parallelism"]
    assert (parallelism["pipeline_parallel_layers_per_stage"], parallelism["pipeline_parallel_first_stage_less_layers"],
            parallelism["pipeline_parallel_last_stage_less_layers"]) == (1, 1, 1)


def _unrolled(layout: str) -> list[str]:
    """Megatron-Core's layout string as its chunks, unrolled by hand: ``(x|)*n`` repeats x|, ``t*n``
    repeats t, commas are cosmetic."""
    import re

    text = layout.replace(",", "")
    while "(" in text:
        text = re.sub(r"\(([^()]*)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
    text = re.sub(r"t\*(\d+)", lambda m: "t" * int(m.group(1)), text)
    return text.split("|")


def test_fp8_linears_in_each_engine():
    """FP8 linears: Megatron-LM's Transformer Engine FP8 with per-tensor current scaling (E4M3
    forward, E5M2 gradients); torchtitan's float8 converter with the output head and a mixture
    of experts' router left out (as the plan keeps them 16-bit); DeepSpeed's JSON has no such
    setting."""
    import pytest

    from nnperf.report.engine_configs import NotExpressible, deepspeed_json, megatron_args

    e = Execution(world=8, data="fsdp", shard=8, micro_batch=1, grad_accum=1)
    flags = megatron_args(e, 32, amp="bf16", fp8=True).split("\n#")[0].split(" \\\n  ")
    assert {"--bf16", "--fp8-format hybrid", "--fp8-recipe tensorwise"} <= set(flags)
    assert not any("fp8" in f for f in megatron_args(e, 32, amp="bf16").split(" \\\n  "))
    toml = torchtitan_toml(e, amp="bf16", fp8=True)
    assert tomllib.loads(toml)["float8"] == {"filter_fqns": ["output", "router.gate"]}
    assert 'converters = ["float8"]' in toml  # for the run's own [model] table
    with pytest.raises(NotExpressible, match="no FP8"):
        deepspeed_json(e, amp="bf16", fp8=True)


def test_loss_fusion_is_megatrons_and_not_torchtitans():
    from nnperf.report.engine_configs import NotExpressible, megatron_args, torchtitan_toml

    e = Execution(world=8, data="zero1", loss_fusion=True, micro_batch=1)
    assert e.megatron_layout
    assert "--cross-entropy-loss-fusion" in megatron_args(e, 32, amp="bf16").split("\n#")[0].split(" \\\n  ")
    assert "--cross-entropy-loss-fusion" not in megatron_args(replace(e, loss_fusion=False), 32, amp="bf16")
    with pytest.raises(NotExpressible, match="fused cross entropy"):
        torchtitan_toml(e, amp="bf16")


def test_tp_comm_overlap_is_megatrons_and_not_torchtitans():
    from nnperf.report.engine_configs import NotExpressible, megatron_args, torchtitan_toml

    e = Execution(world=16, data="ddp", tensor=8, sequence_parallel=True, tp_comm_overlap=True, micro_batch=1)
    flags = megatron_args(e, 32, amp="bf16").split("\n#")[0].split(" \\\n  ")
    assert {"--sequence-parallel", "--tp-comm-overlap"} <= set(flags)
    assert "--tp-comm-overlap" not in megatron_args(replace(e, tp_comm_overlap=False), 32, amp="bf16")
    with pytest.raises(NotExpressible, match="userbuffers"):
        torchtitan_toml(e, amp="bf16")



def test_async_tp_is_torchtitans_and_not_megatrons():
    """torchtitan's [parallelism] enable_async_tensor_parallel (job_config.py before its Python
    configs), with [compile] of the model, which torchtitan requires beside it; neither
    Megatron-LM nor Megatron-DeepSpeed has it."""
    from nnperf.report.engine_configs import NotExpressible, deepspeed_json, megatron_args

    e = Execution(world=16, data="fsdp", shard=2, tensor=8, sequence_parallel=True, async_tp=True, micro_batch=1)
    toml = torchtitan_toml(e, amp="bf16", pointwise="fused")
    assert "enable_async_tensor_parallel = true" in toml.split("[parallelism]")[1].split("\n\n")[0]
    assert 'components = ["model"]' in toml
    assert "enable_async_tensor_parallel" not in torchtitan_toml(replace(e, async_tp=False), amp="bf16",
                                                                pointwise="fused")
    with pytest.raises(NotExpressible, match="compiled model only"):
        torchtitan_toml(e, amp="bf16")
    with pytest.raises(NotExpressible, match="--tp-comm-overlap"):
        megatron_args(e, 32, amp="bf16")
    with pytest.raises(NotExpressible, match="not Megatron-DeepSpeed's"):
        deepspeed_json(e, amp="bf16")


def test_fewer_micro_batches_than_stages_are_megatrons_not_torchtitans():
    """Megatron-LM's 1F1B runs 2 micro-batches on 4 stages (its arguments say so); torch's
    Schedule1F1B refuses fewer micro-batches than stages, so torchtitan cannot."""
    import pytest

    from nnperf.report.engine_configs import NotExpressible, megatron_args, torchtitan_refusals

    e = Execution(world=4, data="ddp", pipeline=4, pipeline_schedule="1f1b", micro_batch=1, grad_accum=2)
    assert "--pipeline-model-parallel-size 4" in megatron_args(e, 8, amp="bf16")
    with pytest.raises(NotExpressible, match=r"Schedule1F1B.*\(2 < 4\)"):
        torchtitan_refusals(e, "bf16", None, "flash")


def test_a_tensor_and_pipeline_parallel_layout_is_megatron_deepspeeds():
    """MT-NLG 530B's layout (TP 8 x PP 35 x DP 8, 1F1B, ZeRO-1, full recomputation, bf16 model):
    the JSON Megatron-DeepSpeed reads holds its batch (1 x 240 x 8 = 1920), ZeRO stage and
    precision, the bf16 model's gradients kept in bf16 as planned; its own arguments hold the
    model parallelism and the recomputation."""
    from nnperf.report.engine_configs import deepspeed_json, megatron_deepspeed_args

    e = Execution(world=2240, data="zero1", tensor=8, pipeline=35, pipeline_schedule="1f1b", micro_batch=1,
                  grad_accum=240, checkpoint="full")
    config = json.loads(deepspeed_json(e, dtype="bf16", clip=1.0))
    assert config["train_batch_size"] == 1920 and config["gradient_accumulation_steps"] == 240
    assert config["zero_optimization"]["stage"] == 1 and config["bf16"] == {"enabled": True}
    assert config["data_types"] == {"grad_accum_dtype": "bf16"} and config["gradient_clipping"] == 1.0
    flags = megatron_deepspeed_args(e, dtype="bf16", seq_len=2048).split(" \\\n  ")
    assert flags == ["--tensor-model-parallel-size 8", "--pipeline-model-parallel-size 35", "--micro-batch-size 1",
                     "--global-batch-size 1920", "--seq-length 2048", "--checkpoint-activations", "--bf16",
                     "--zero-stage 1", "--deepspeed", "--deepspeed_config ds_config.json"]
    tensor_only = Execution(world=16, data="ddp", tensor=8, sequence_parallel=True)
    flags = megatron_deepspeed_args(tensor_only, amp="bf16").split(" \\\n  ")
    assert {"--no-pipeline-parallel", "--sequence-parallel", "--zero-stage 0"} <= set(flags)
    assert "data_types" not in json.loads(deepspeed_json(tensor_only, amp="bf16"))  # fp32 gradients, as planned


@pytest.mark.parametrize(("changes", "words"), [
    ({"pipeline_schedule": "interleaved-1f1b", "virtual_stages": 2}, "runs 1F1B"),
    ({"data": "fsdp"}, "ZeRO stage 0 or 1 only"),
    ({"first_stage_layers": 3, "last_stage_layers": 3}, "partition method"),
    ({"tp_comm_overlap": True, "sequence_parallel": True}, "userbuffers"),
    ({"checkpoint": "selective-op"}, "core attention"),
    ({"context": 2, "world": 64}, "Ulysses"),
])
def test_what_megatron_deepspeed_cannot_run_is_said(changes, words):
    from nnperf.report.engine_configs import NotExpressible, deepspeed_json

    base = {"world": 32, "data": "zero1", "tensor": 4, "pipeline": 4, "pipeline_schedule": "1f1b",
            "micro_batch": 1, "grad_accum": 8}
    with pytest.raises(NotExpressible, match=words):
        deepspeed_json(Execution(**{**base, **changes}), dtype="bf16")
