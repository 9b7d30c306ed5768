"""Megatron-Core's vocabulary-parallel embedding (``trace.parallel.vocab_parallel_embedding``): run
for real on 2 gloo ranks against ``nn.Embedding`` on the whole table (output and weight gradient,
32- and 16-bit, an uneven split, ids on both sides of it, all-reduced and reduce-scattered along
the sequence as ``RowwiseParallel`` does); and on a traced rank of a Megatron-LM layout, the
weight gradient of the rank's rows alone where DTensor's embedding makes the whole table's."""

from __future__ import annotations

import pytest
import torch
from gloo_ranks import run_ranks

from nnperf.layout import Execution
from nnperf.trace.distributed import trace_rank
from nnperf.trace.options import TraceOptions

WORLD = 2
VOCAB, DIM = 13, 4  # 13 rows: slices of 7 and 6, as torch.chunk (DTensor's Shard) splits them
DTYPES = (torch.float32, torch.bfloat16)


def _worker(rank: int) -> dict:
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import RowwiseParallel, parallelize_module

    from nnperf.trace.parallel.vocab_parallel_embedding import MegatronEmbedding

    mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("tensor",))
    out = {}
    for dtype in DTYPES:
        for sequence_parallel in (False, True):
            torch.manual_seed(0)
            whole = nn.Embedding(VOCAB, DIM).to(dtype)
            split = nn.Embedding(VOCAB, DIM).to(dtype)
            split.load_state_dict(whole.state_dict())
            layout = Shard(1) if sequence_parallel else Replicate()
            parallelize_module(split, mesh, RowwiseParallel(input_layouts=Replicate(), output_layouts=layout))
            ids = torch.tensor([[0, 6, 7, 12], [3, 9, 6, 7]])  # both slices and their edges
            upstream = torch.linspace(-1, 1, ids.numel() * DIM).reshape(*ids.shape, DIM).to(dtype)
            expected = whole(ids)
            expected.backward(upstream)
            with MegatronEmbedding():
                got = split(ids)
            output = got.detach().clone()  # before backward, whose collectives may reuse its buffer
            local_upstream = upstream.chunk(WORLD, dim=1)[rank] if sequence_parallel else upstream
            got.backward(local_upstream)
            grad = split.weight.grad.full_tensor()
            out[str(dtype), sequence_parallel] = (output, expected.detach(), grad, whole.weight.grad)
    return out


@pytest.fixture(scope="module")
def real_runs():
    return run_ranks(_worker, WORLD, timeout_s=120)


@pytest.mark.process
@pytest.mark.parametrize("sequence_parallel", [False, True])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_output_and_gradient_match_the_whole_table_on_every_rank(real_runs, dtype, sequence_parallel):
    for rank in range(WORLD):
        got, expected, grad, expected_grad = real_runs[rank][str(dtype), sequence_parallel]
        if sequence_parallel:
            expected = expected.chunk(WORLD, dim=1)[rank]
        torch.testing.assert_close(got, expected)  # a sum of zeros and one row: exact
        torch.testing.assert_close(grad, expected_grad)


TINY = {"n_layer": 1, "dim": 16, "n_heads": 2, "n_kv_heads": 2, "ffn_hidden": 32, "vocab": 65}
BATCH, SEQ = 2, 8


def _embedding_backward(execution: Execution):
    from nnperf.zoo.llama import build

    traced = trace_rank(lambda: build(BATCH, SEQ, **TINY), TraceOptions(optimizer="adamw", dtype="bf16"),
                        execution, lambda model: ["layers.0"])
    [event] = [e for e in traced.trace.events if e.name == "aten.embedding_dense_backward"]
    return event


def test_megatron_layouts_make_the_gradient_of_their_rows_alone():
    """33 of the 65 rows on rank 0 (torch.chunk's split), each ``dim`` wide."""
    event = _embedding_backward(Execution(world=4, data="zero1", tensor=WORLD, sequence_parallel=True))
    assert tuple(event.outputs[0].shape) == (-(-TINY["vocab"] // WORLD), TINY["dim"])


def test_torchtitans_layouts_keep_dtensors_embedding():
    """FSDP beside tensor parallelism runs DTensor's embedding, whose backward makes the whole
    table's gradient (no row-sharded strategy) and keeps the rank's slice of it."""
    event = _embedding_backward(Execution(world=4, data="fsdp", shard=2, tensor=WORLD, sequence_parallel=True))
    assert tuple(event.outputs[0].shape) == (TINY["vocab"], TINY["dim"])
