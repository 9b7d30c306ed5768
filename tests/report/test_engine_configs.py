"""The torchtitan TOML's batch settings: torchtitan accumulates global_batch_size //
(local_batch_size x data-parallel ranks) steps, and splits a pipeline rank's local batch into
micro-batches, so the numbers it must get follow from the layout by hand."""

from __future__ import annotations

import sys

from nnperf.report.engine_configs import torchtitan_toml
from nnperf.trace.distributed import Execution

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
