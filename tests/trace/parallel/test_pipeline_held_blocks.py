"""A pipeline rank's engines touch only the blocks of the chunks it holds (``held_blocks_only``):
the other chunks' blocks pass their input through, and the stage shapes a rank reads through
them are the ones the whole model gives (worked out by hand here); a block that does not keep
its input's shape is one clear error, not a wrong shape."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn

from nnperf.layout import Execution
from nnperf.trace.distributed import trace_rank
from nnperf.trace.options import TraceOptions
from nnperf.trace.parallel.pipeline import held_blocks_only, split, stage_shapes

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
    x = torch.randn(2, SEQ, DIM)
    for i, block in enumerate(model.layers):
        if i in held:
            assert block is original[i]
        else:  # no parameters, and its input passes through
            assert not list(block.parameters())
            assert block(x) is x


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
    model = _llama(4).model
    # blocks 0-1 are the first chunk: the second narrows the stream
    model.layers[0], model.layers[1] = nn.Linear(DIM, DIM), nn.Linear(DIM, DIM // 2)
    chunks = split(model, [2, 2])
    with pytest.raises(RuntimeError, match=r"Linear blocks turned \(2, 8, 32\) torch.float32 into \(2, 8, 16\)"):
        stage_shapes(chunks, (torch.randint(0, VOCAB, (2, SEQ)),), 2, contextlib.nullcontext)
