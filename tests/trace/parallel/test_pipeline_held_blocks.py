"""A pipeline rank's engines touch only the blocks of the chunks it holds (``held_blocks_only``),
and its stage shapes come from the chunks' ends without their blocks (``stage_shapes``): the
shapes are the ones the whole model gives (worked out by hand here), activation checkpointing
still finds the rank's blocks, and a block that does not keep its input's shape is one clear
error in the traced step, not a wrong shape."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nnperf.layout import Execution
from nnperf.trace.distributed import trace_rank
from nnperf.trace.options import TraceOptions
from nnperf.trace.parallel.pipeline import held_blocks_only

DIM, SEQ, VOCAB = 32, 8, 64


def _llama(n_layer: int, batch: int = 2):
    from nnperf.zoo import get_model

    return get_model("llama-7b").build(batch=batch, seq_len=SEQ, n_layer=n_layer, dim=DIM, n_heads=4,
                                       ffn_hidden=48, vocab=VOCAB)


@pytest.mark.parametrize(("pipeline", "schedule", "virtual", "rank", "held"), [
    (3, "gpipe", 1, 1, [2, 3]),  # 6 blocks over 3 stages: the middle rank holds blocks 2 and 3
    (2, "interleaved-1f1b", 2, 1, [2, 3, 6, 7]),  # 8 blocks, 4 chunks looped: rank 1 holds chunks 1 and 3
])
def test_only_the_ranks_blocks_are_inside(pipeline, schedule, virtual, rank, held):
    n_layer = 6 if pipeline == 3 else 8
    model = _llama(n_layer).model
    original = list(model.layers)
    execution = Execution(world=pipeline, pipeline=pipeline, pipeline_schedule=schedule, virtual_stages=virtual,
                          grad_accum=pipeline)
    with held_blocks_only(model, execution, rank):
        assert list(model.layers) == [original[i] for i in held]
    assert len(model.layers) == n_layer
    assert list(model.layers) == original


def test_a_one_block_chunk_is_still_checkpointed():
    # 3 blocks over 3 stages: each rank holds one block, which activation checkpointing finds
    # among the model's repeated blocks (a block of a class seen once is no repeated block)
    from torch.utils.checkpoint import checkpoint

    from nnperf.search.memory_variants import apply_checkpointing

    execution = Execution(world=3, pipeline=3, pipeline_schedule="gpipe", grad_accum=1, checkpoint="full")
    for stage in range(3):
        traced = trace_rank(lambda: _llama(3), TraceOptions(optimizer="adamw"), execution, lambda model: [],
                            prepare=apply_checkpointing, rank=stage)
        (block,) = traced.workload.model.stages[0].layers
        assert block.forward.func is checkpoint


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_stage_shapes_read_through_the_blocks_a_rank_does_not_hold(sequence_parallel):
    # 6 blocks, tensor parallelism 2 x 3 pipeline stages, one micro-batch of 2 sequences of 8:
    # between stages the residual stream, (2, 8, 32) fp32, or (2, 4, 32) with sequence
    # parallelism (each tensor-parallel rank holds half the sequence)
    execution = Execution(world=6, tensor=2, sequence_parallel=sequence_parallel, pipeline=3,
                          pipeline_schedule="gpipe", grad_accum=1)
    boundary = (2, SEQ // 2 if sequence_parallel else SEQ, DIM)
    for stage in range(3):
        traced = trace_rank(lambda: _llama(6), TraceOptions(optimizer="adamw"), execution, lambda model: [],
                            rank=stage * 2)
        pipeline_rank = traced.workload.model
        (given, produced), = pipeline_rank.shapes
        if stage > 0:
            assert (tuple(given.shape), given.dtype) == (boundary, torch.float32)
        if stage < 2:
            assert (tuple(produced.shape), produced.dtype) == (boundary, torch.float32)
        blocks = pipeline_rank.stages[0].layers
        assert len(blocks) == 2
        assert all(type(p).__name__ == "DTensor" for b in blocks for p in b.parameters())


def test_a_block_that_changes_its_input_is_one_error():
    # 6 blocks over 3 stages; block 3 (the middle stage's last) narrows the stream to 16
    def narrowed():
        workload = _llama(6)
        workload.model.layers[3] = nn.Sequential(nn.Linear(DIM, DIM // 2))
        return workload

    execution = Execution(world=3, pipeline=3, pipeline_schedule="gpipe", grad_accum=1)
    with pytest.raises(RuntimeError, match=r"pipeline stage 1 produced \(\(2, 8, 16\), torch.float32, "
                                           r"\(128, 16, 1\)\), not the \(\(2, 8, 32\)"):
        trace_rank(narrowed, TraceOptions(optimizer="adamw"), execution, lambda model: [], rank=1)


@pytest.mark.parametrize(("data", "element_bytes"), [("fsdp", 2), ("ddp", 4)])
def test_stages_pass_what_the_data_parallel_engine_computes_in(data, element_bytes):
    # autocast bf16: FSDP2 gathers the parameters in bf16 and casts a stage's input to it, so its
    # stages pass bf16; under DDP the parameters stay fp32 and so does the residual stream. Rank 0
    # of 2 stages, one micro-batch of 2 x 8 tokens of width 32: it sends the activation and
    # receives its gradient, 2 x 8 x 32 elements each
    from nnperf.trace.blocks import repeated_blocks

    execution = Execution(world=4, data=data, shard=2 if data == "fsdp" else 1, pipeline=2,
                          pipeline_schedule="gpipe", grad_accum=1)
    traced = trace_rank(lambda: _llama(4), TraceOptions(optimizer="adamw", amp="bf16"), execution,
                        repeated_blocks, rank=0)
    (_, produced), = traced.workload.model.shapes
    assert produced.dtype == (torch.bfloat16 if data == "fsdp" else torch.float32)
    sends = [c.bytes for c in traced.collectives if c.kind == "send_recv"]
    assert sends == [2 * SEQ * DIM * element_bytes] * 2


def test_fp8_converts_the_linears_of_a_one_block_chunk():
    # 3 blocks over 3 stages: a stage holds one block, no repeated block of its own; its
    # linears are marked as FP8 ones while the model is whole (trace.blocks.mark_blocks)
    def build():
        from nnperf.zoo import get_model

        return get_model("llama-7b").build(batch=2, seq_len=SEQ, n_layer=3, dim=64, n_heads=4, ffn_hidden=128,
                                           vocab=VOCAB)

    execution = Execution(world=3, pipeline=3, pipeline_schedule="gpipe", grad_accum=1)
    traced = trace_rank(build, TraceOptions(amp="bf16", fp8=True), execution, lambda model: [], rank=1)
    converted = set(traced.trace.config["fp8_linears"])
    # the block's attention (wq, wk, wv, wo) and feed-forward (w1, w2, w3) linears
    ran = {e.module for e in traced.trace.events if e.name in ("aten.mm", "aten.addmm")
           and e.module.split(".")[-1] in ("wq", "wk", "wv", "wo", "w1", "w2", "w3")}
    assert len(ran) == 7
    assert ran <= converted


def test_the_last_stage_keeps_the_logits_split_for_the_loss():
    # TP 2 x PP 2: the last stage's cross entropy runs on each rank's half of the vocabulary
    # (torchtitan's loss parallelism, Megatron-LM's vocabulary-parallel cross entropy): no
    # gather of the logits, no op over the whole vocabulary after the head
    vocab, batch = 256, 2

    def build():
        from nnperf.zoo import get_model

        return get_model("llama-7b").build(batch=batch, seq_len=SEQ, n_layer=2, dim=64, n_heads=4, n_kv_heads=2,
                                           ffn_hidden=128, vocab=vocab)

    execution = Execution(world=4, tensor=2, sequence_parallel=True, pipeline=2, pipeline_schedule="1f1b",
                          micro_batch=1, grad_accum=2)
    traced = trace_rank(build, TraceOptions(dtype="bf16"), execution, lambda model: [], rank=2)  # last stage
    logits_bytes = 1 * SEQ * vocab * 2  # one micro-batch's logits in bf16
    assert not [c for c in traced.collectives if c.kind == "all_gather" and c.bytes == logits_bytes]
    after_head = [e for e in traced.trace.events if e.module in ("(loss)", "") or e.module.startswith("(loss)")]
    shapes = [tuple(t.shape) for e in after_head for t in e.inputs if len(t.shape) >= 2]
    assert any(s[-1] == vocab // 2 for s in shapes)
    assert not any(s[-1] == vocab for s in shapes)
