"""The selective checkpointing policies a layout can name, on a traced Llama rank: what each
recomputes in backward, counted against the same step without checkpointing, and how the
engine configs write them. Expected counts are worked out by hand from each engine's policy."""

from __future__ import annotations

from collections import Counter

import pytest

from nnperf.errors import UsageError
from nnperf.layout import Execution
from nnperf.report.engine_configs import NotExpressible, megatron_args, torchtitan_toml
from nnperf.search.memory_variants import apply_checkpointing
from nnperf.trace.blocks import repeated_blocks
from nnperf.trace.distributed import trace_rank
from nnperf.trace.options import TraceOptions
from nnperf.workload import Workload
from nnperf.zoo import get_model

BLOCKS, BATCH, SEQ, DIM, HEADS, KV_HEADS, FFN = 2, 2, 16, 64, 4, 1, 96
TOKENS = BATCH * SEQ


def _build(attention: str = "sdpa") -> Workload:
    return get_model("llama-7b").build(batch=BATCH, seq_len=SEQ, n_layer=BLOCKS, dim=DIM, n_heads=HEADS,
                                       n_kv_heads=KV_HEADS, ffn_hidden=FFN, vocab=64, attention=attention)


def _backward(policy: str | None, attention: str = "sdpa", **options) -> tuple[Counter, Counter]:
    """Output shapes of the backward's matrix products, and the backward's op names."""
    execution = Execution(world=2, data="fsdp", shard=2, checkpoint=policy)
    prepare = None if policy is None else (lambda w: apply_checkpointing(w, selective=policy))
    events = trace_rank(lambda: _build(attention), TraceOptions(**options), execution, repeated_blocks,
                        prepare).trace.events
    backward = [e for e in events if e.phase == "backward"]
    return (Counter(tuple(e.outputs[0].shape) for e in backward if e.name == "aten.mm"),
            Counter(e.name for e in backward))


def test_torchtitan_op_policy_recomputes_every_second_matmul_of_a_block():
    """A Llama block runs wq, wk, wv, wo, w1, w3, w2 (7 matrix products, in that order):
    torchtitan's policy recomputes the 2nd, 4th and 6th (wk, wo, w3) and nothing else of the
    products; everything off its save list (norms, rotary, SiLU) is recomputed as under
    nnperf's selective policy."""
    plain_mm, _ = _backward(None)
    op_mm, op_names = _backward("selective-op")
    _, selective_names = _backward("selective")
    head_dim = DIM // HEADS
    wk, wo, w3 = (TOKENS, KV_HEADS * head_dim), (TOKENS, DIM), (TOKENS, FFN)
    assert op_mm - plain_mm == Counter({wk: BLOCKS, wo: BLOCKS, w3: BLOCKS})
    assert plain_mm - op_mm == Counter()
    assert op_names["aten.pow"] == selective_names["aten.pow"]  # RMSNorm recomputed as before


def test_megatron_policy_recomputes_the_core_attention_only():
    """Megatron-LM's --recompute-activations: one attention forward per block in backward, no
    matrix product or norm more than without checkpointing."""
    plain_mm, plain_names = _backward(None)
    mm, names = _backward("selective-attention")
    assert mm == plain_mm
    assert names["nnperf.attention"] - plain_names["nnperf.attention"] == BLOCKS
    for op in ("aten.pow", "aten.silu", "aten.mul", "aten.rsqrt"):
        assert names[op] == plain_names[op], op


def test_megatron_policy_recomputes_the_unfused_core_attention():
    """With the attention unfused (``--sdpa unfused``, as Megatron-LM ran before flash
    attention), the core attention is its unfused kernels: the score GEMM, the causal mask,
    softmax and the GEMM with the values (and dropout, 0 here) run once more per block in
    backward; the projections and norms do not."""
    plain_mm, plain_names = _backward(None, sdpa="unfused")
    mm, names = _backward("selective-attention", sdpa="unfused")
    assert mm == plain_mm
    for op in ("aten._softmax", "aten.masked_fill"):
        assert names[op] - plain_names[op] == BLOCKS, op
    assert names["aten.bmm"] - plain_names["aten.bmm"] == 2 * BLOCKS  # scores, then values
    for op in ("aten.pow", "aten.silu", "aten.rsqrt"):
        assert names[op] == plain_names[op], op


@pytest.mark.parametrize("policy", ["selective", "selective-op"])
def test_flex_attention_is_saved_by_the_selective_policies(policy):
    """torchtitan's list saves FlexAttention's output (its activation_checkpoint.py), as it
    saves SDPA's: no attention forward runs again in backward."""
    _, plain = _backward(None, attention="flex")
    _, names = _backward(policy, attention="flex")
    assert names["higher_order.flex_attention"] == plain["higher_order.flex_attention"] == 0
    assert names["higher_order.flex_attention_backward"] == BLOCKS


def test_megatrons_policy_says_it_recomputes_no_flex_attention():
    """Megatron-LM's core-attention checkpoint wraps SDPA; FlexAttention (no Megatron-LM backend)
    runs once, and the trace says what was not recomputed."""
    execution = Execution(world=2, data="fsdp", shard=2, checkpoint="selective-attention")
    trace = trace_rank(lambda: _build("flex"), TraceOptions(), execution, repeated_blocks,
                       lambda w: apply_checkpointing(w, selective="selective-attention")).trace
    backward = Counter(e.name for e in trace.events if e.phase == "backward")
    assert backward["higher_order.flex_attention"] == 0
    assert any("calls no F.scaled_dot_product_attention" in a for a in trace.config["assumptions"])


def test_unknown_checkpointing_is_one_line():
    with pytest.raises(UsageError, match="unknown activation checkpointing 'sometimes'; valid: none, full, selective"):
        Execution(world=2, data="fsdp", shard=2, checkpoint="sometimes").validate()


def test_none_is_no_checkpointing_as_the_cli_spells_it():
    """A layout written as a row or a config says "none" where --checkpoint does: the same layout
    as one that names no checkpointing (it was "unknown activation checkpointing 'none'")."""
    spelled = Execution(world=2, data="fsdp", shard=2, checkpoint="none")
    spelled.validate()
    assert spelled == Execution(world=2, data="fsdp", shard=2) and spelled.checkpoint is None


def test_engine_configs_name_the_policy_each_engine_runs():
    op = Execution(world=8, data="fsdp", shard=8, checkpoint="selective-op")
    toml = torchtitan_toml(op)
    assert 'mode = "selective"' in toml and 'selective_ac_option = "op"' in toml
    with pytest.raises(NotExpressible, match="per-op"):
        megatron_args(op, layers=32)
    attention = Execution(world=8, tensor=8, checkpoint="selective-attention")
    assert "--recompute-activations" in megatron_args(attention, layers=32)
    with pytest.raises(NotExpressible, match="attention-only"):
        torchtitan_toml(attention)
    earlier = Execution(world=8, data="fsdp", shard=8, checkpoint="selective-op-recompute-a2a")
    with pytest.raises(NotExpressible, match="today's torchtitan saves the expert all-to-alls"):
        torchtitan_toml(earlier)
    with pytest.raises(NotExpressible, match="per-op"):
        megatron_args(earlier, layers=32)


def test_engine_configs_write_the_precision_and_attention_each_engine_has():
    """A bf16 model with unfused attention (the Megatron rows): Megatron-LM's --bf16 and
    --attention-backend unfused, DeepSpeed's bf16 section; torchtitan has neither setting."""
    import json

    from nnperf.report.engine_configs import deepspeed_json

    tp = Execution(world=8, tensor=8, sequence_parallel=True)
    args = megatron_args(tp, layers=32, dtype="bf16", sdpa="unfused")
    assert "--bf16" in args and "--attention-backend unfused" in args
    # the default, PyTorch's flash kernel: Megatron-LM's flash backend, not its auto (cuDNN's on Hopper)
    assert "--attention-backend flash" in megatron_args(tp, layers=32, amp="bf16")
    with pytest.raises(NotExpressible, match="fp32 parameters"):
        torchtitan_toml(tp, dtype="bf16")
    with pytest.raises(NotExpressible, match="unfused attention"):
        torchtitan_toml(tp, amp="bf16", sdpa="unfused")
    fsdp = Execution(world=8, data="fsdp", shard=8)
    assert json.loads(deepspeed_json(fsdp, dtype="bf16"))["bf16"] == {"enabled": True}


def test_megatron_policy_traces_pipeline_stages_under_autocast():
    """Tensor x pipeline stages under bf16 autocast (the Megatron rows' layout): the recomputed
    attention runs once per block and micro-batch; casts are recomputed rather than cached (a
    cached cast handed to the wrong op broke DTensor's layouts)."""
    def build() -> Workload:
        return get_model("gpt2").build(batch=2, seq_len=16, n_layer=4, n_embd=64, n_head=4, vocab=64,
                                       n_positions=16)

    execution = Execution(world=4, tensor=2, sequence_parallel=True, pipeline=2, pipeline_schedule="1f1b",
                          grad_accum=2, checkpoint="selective-attention")
    traced = trace_rank(build, TraceOptions(amp="bf16"), execution, repeated_blocks,
                        lambda w: apply_checkpointing(w, selective="selective-attention"))
    names = Counter((e.phase, e.name) for e in traced.trace.events)
    blocks_here, micro_batches = 2, 2  # rank 0 holds the first of two stages of four blocks
    assert names["forward", "nnperf.attention"] == blocks_here * micro_batches
    assert names["backward", "nnperf.attention"] == blocks_here * micro_batches


def test_engine_configs_say_where_flex_attention_is_set():
    """torchtitan sets FlexAttention in its model flavor's args, not in the TOML: a comment
    names them; Megatron-LM has no FlexAttention backend."""
    fsdp = Execution(world=8, data="fsdp", shard=8)
    assert "FlexAttention" not in torchtitan_toml(fsdp)
    assert 'attn_mask_type = "causal"' in torchtitan_toml(fsdp, attention="flex")
    documents = torchtitan_toml(fsdp, attention="flex", doc_len=512)
    assert 'use_flex_attn = True, attn_mask_type = "block_causal" (documents of 512 tokens assumed)' in documents
    with pytest.raises(NotExpressible, match="FlexAttention is not one of Megatron-LM's attention backends"):
        megatron_args(fsdp, layers=32, attention="flex")


def test_cudnn_attention_is_megatron_lms_fused_backend_and_not_a_torchtitan_setting():
    """--sdpa cudnn: Megatron-LM's --attention-backend fused (Transformer Engine's cuDNN
    attention); torchtitan picks SDPA's order itself."""
    tp = Execution(world=8, tensor=8, sequence_parallel=True)
    assert "--attention-backend fused" in megatron_args(tp, layers=32, dtype="bf16", sdpa="cudnn")
    with pytest.raises(NotExpressible, match="cuDNN attention first"):
        torchtitan_toml(tp, amp="bf16", sdpa="cudnn")


def test_fused_pointwise_is_torchtitans_compiled_model():
    """--pointwise fused: torchtitan's [compile] with the model among its components."""
    from nnperf.report.torchtitan_python import torchtitan_python

    fsdp = Execution(world=8, data="fsdp", shard=8)
    toml = torchtitan_toml(fsdp, amp="bf16", pointwise="fused", loss="compiled")
    assert '[compile]\nenable = true\ncomponents = ["model", "loss"]' in toml
    assert "[compile]" not in torchtitan_toml(fsdp, amp="bf16")
    python = torchtitan_python(fsdp, "llama-7b", 2048, amp="bf16", pointwise="fused")
    assert "config.compile.components = ['model']" in python


def test_megatron_args_say_its_default_fusions_were_not_timed_in_an_eager_plan():
    tp = Execution(world=8, tensor=8, sequence_parallel=True)
    assert "plan with --pointwise fused" in megatron_args(tp, layers=32, amp="bf16")
    assert "--pointwise" not in megatron_args(tp, layers=32, amp="bf16", pointwise="fused")
