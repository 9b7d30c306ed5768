"""Megatron-LM's tensor-parallel communication beside its GEMMs (``search.plan.rank.
tensor_parallel_chunks``, replayed by ``passes.comm_timeline``): on a two-block Llama traced on
ZeRO-1 x TP 2 with sequence parallelism, which collective runs in how many chunks, by hand from
Transformer Engine's ``initialize_ub`` defaults and Megatron-LM's linear layers."""

from __future__ import annotations

import pytest

from nnperf.errors import UsageError
from nnperf.layout import Execution
from nnperf.search.plan.rank import PIPELINE_SPLITS, tensor_parallel_chunks
from nnperf.trace.distributed import trace_rank
from nnperf.trace.options import TraceOptions

LLAMA = {"n_layer": 2, "dim": 32, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 48, "vocab": 101}
TP = 2


def _chunks(overlap: bool) -> dict[tuple[str, str, str], set[int | None]]:
    from nnperf.zoo import get_model

    execution = Execution(world=2 * TP, data="zero1", tensor=TP, sequence_parallel=True, micro_batch=2,
                          tp_comm_overlap=overlap)
    traced = trace_rank(lambda: get_model("llama-7b").build(batch=2, seq_len=16, **LLAMA),
                        TraceOptions(optimizer="adamw"), execution, lambda model: [])
    by_index = {c.index: c for c in traced.collectives}
    chunks = tensor_parallel_chunks(execution, traced.trace, by_index)
    out: dict[tuple[str, str, str], set[int | None]] = {}
    for c in traced.collectives:
        tensor_parallel = c.group_ranks == (0, 1)
        where = "block" if ".layers." in c.module else "outside"
        out.setdefault((c.kind, c.phase, where if tensor_parallel else "data"), set()).add(chunks(c.index))
    return out


@pytest.fixture(scope="module")
def chunks():
    return _chunks(False), _chunks(True)


def test_megatron_reduce_scatters_an_input_gradient_beside_the_weight_gradient(chunks):
    """Without --tp-comm-overlap only the backward reduce-scatters run beside a GEMM, in one
    piece (the output layer's too: Megatron-LM's ColumnParallelLinear); nothing else, and
    nothing of the data-parallel group."""
    plain, _ = chunks
    assert plain[("reduce_scatter", "backward", "block")] == {1}
    assert plain[("reduce_scatter", "backward", "outside")] == {1}
    assert plain[("all_gather", "forward", "block")] == plain[("reduce_scatter", "forward", "block")] == {None}
    assert all(v == {None} for (kind, phase, where), v in plain.items() if where == "data")


def test_userbuffers_pipeline_the_blocks_gathers_and_scatters(chunks):
    """With it the blocks' all-gathers run in one chunk per tensor-parallel rank (ring
    exchange), their forward reduce-scatters in 4 (pipeline); the output layer (not Transformer
    Engine's) and the embedding's gathers stay whole."""
    _, overlapped = chunks
    assert overlapped[("all_gather", "forward", "block")] == {TP}
    assert overlapped[("reduce_scatter", "forward", "block")] == {PIPELINE_SPLITS} == {4}
    assert overlapped[("all_gather", "backward", "block")] == {TP}
    assert overlapped[("reduce_scatter", "backward", "block")] == {1}
    assert overlapped[("all_gather", "forward", "outside")] == {None}
    assert all(v == {None} for (kind, phase, where), v in overlapped.items() if where == "data")


@pytest.mark.parametrize("layout", [dict(world=4, data="zero1", tensor=2), dict(world=4, data="fsdp", shard=2, tensor=2,
                                                                                 sequence_parallel=True)])
def test_tp_comm_overlap_needs_megatrons_sequence_parallel_layout(layout):
    with pytest.raises(UsageError, match="tp_comm_overlap is Megatron-LM's --tp-comm-overlap"):
        Execution(**layout, tp_comm_overlap=True).validate()
