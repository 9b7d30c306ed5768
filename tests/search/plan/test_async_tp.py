"""torch's async tensor parallelism beside its GEMMs (``search.plan.rank.
async_tensor_parallel_chunks``, replayed by ``passes.comm_timeline``): on a two-block Llama
traced on FSDP x TP 2 with sequence parallelism and full checkpointing, which collective runs in
how many chunks, by hand from Inductor's micro-pipeline pass (torch/_inductor/fx_passes/
micro_pipeline_tp.py: an all-gather feeding matmuls as their left operand, a matmul whose one
user is a reduce-scatter; one chunk per tensor-parallel rank)."""

from __future__ import annotations

import pytest

from nnperf.errors import UsageError
from nnperf.layout import Execution
from nnperf.search.plan.rank import tensor_parallel_chunks
from nnperf.trace.distributed import trace_rank
from nnperf.trace.options import TraceOptions

LLAMA = {"n_layer": 2, "dim": 32, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 48, "vocab": 101}
TP = 2


def _chunks(async_tp: bool, model: str = "llama-7b", checkpoint: str | None = "full",
            **sizes: int) -> dict[tuple[str, str, str], set[int | None]]:
    from nnperf.search.plan.evaluate import prepare_for
    from nnperf.trace.blocks import repeated_blocks
    from nnperf.zoo import get_model

    execution = Execution(world=2 * TP, data="fsdp", tensor=TP, sequence_parallel=True, micro_batch=2,
                          checkpoint=checkpoint, async_tp=async_tp)
    traced = trace_rank(lambda: get_model(model).build(batch=2, seq_len=16, **(sizes or LLAMA)),
                        TraceOptions(optimizer="adamw"), execution, repeated_blocks, prepare_for(execution))
    by_index = {c.index: c for c in traced.collectives}
    chunks = tensor_parallel_chunks(execution, traced.trace, by_index)
    out: dict[tuple[str, str, str], set[int | None]] = {}
    for c in traced.collectives:
        tensor_parallel = c.group_ranks == (0, 1)
        phase = "recompute" if traced.trace.events[c.index].recomputed else str(c.phase)
        where = "block" if c.module.startswith(("layers.", "h.")) else "outside"
        out.setdefault((c.kind, phase, where if tensor_parallel else "data"), set()).add(
            chunks(c.index) if chunks else None)
    return out


@pytest.fixture(scope="module")
def chunks():
    return _chunks(False), _chunks(True)


def test_torch_runs_its_tensor_parallel_collectives_whole_without_async_tp(chunks):
    plain, _ = chunks
    assert plain[("all_gather", "forward", "block")] == {None}
    assert all(v == {None} for v in plain.values())


def test_async_tp_pipelines_what_inductor_fuses_with_a_matmul(chunks):
    """Forward's and recomputation's all-gathers and reduce-scatters, and backward's
    all-gathers (an output gradient, gathered for the row-parallel input gradient), in one chunk
    per rank; backward's reduce-scatter follows the sum of the column-parallel input gradients
    (q, k, v; w1, w3), not a matmul, and stays whole; so does all outside the compiled blocks
    and the data-parallel group's (``fed_by_matmul``)."""
    _, pipelined = chunks
    for phase in ("forward", "recompute"):
        assert pipelined[("all_gather", phase, "block")] == {TP}
        assert pipelined[("reduce_scatter", phase, "block")] == {TP}
    assert pipelined[("all_gather", "backward", "block")] == {TP}
    assert pipelined[("reduce_scatter", "backward", "block")] == {None}
    assert all(v == {None} for (kind, phase, where), v in pipelined.items() if where != "block")


def test_a_reduce_scatter_one_matmul_feeds_is_pipelined_in_backward_too():
    """GPT-2's c_attn and c_fc each read their block's normed input alone: the input gradient
    each reduce-scatters in backward is one matmul's (no sum between), which Inductor fuses."""
    gpt2 = _chunks(True, "gpt2", None, n_layer=2, n_embd=32, n_head=4, vocab=101)
    assert gpt2[("reduce_scatter", "backward", "block")] == {TP}
    assert gpt2[("all_gather", "backward", "block")] == {TP}


@pytest.mark.parametrize(("layout", "words"), [
    (dict(world=4, data="fsdp", shard=2, tensor=2), "it needs tensor > 1 with sequence parallelism"),
    (dict(world=4, data="zero1", tensor=2, sequence_parallel=True), "only Megatron-LM runs"),
    (dict(world=4, data="fsdp", shard=2, tensor=2, sequence_parallel=True, framework="megatron"),
     "async tensor parallelism .* is torch's"),
])
def test_async_tp_needs_torchs_sequence_parallel_layout(layout, words):
    with pytest.raises(UsageError, match=words):
        Execution(**layout, async_tp=True).validate()


def test_async_tp_beside_fsdp_and_alone_is_valid():
    Execution(world=4, data="fsdp", shard=2, tensor=2, sequence_parallel=True, async_tp=True).validate()
    Execution(world=2, data="ddp", tensor=2, sequence_parallel=True, async_tp=True).validate()


def test_evaluate_refuses_async_tp_without_the_compiled_blocks():
    """A caller of ``evaluate`` (plan_compare's rows) gets the search's line, before any trace."""
    from nnperf.hardware.catalog import load_gpu
    from nnperf.hardware.cluster import cluster_for_gpu
    from nnperf.request import ModelRequest
    from nnperf.search.plan.evaluate import evaluate

    execution = Execution(world=4, data="fsdp", shard=2, tensor=2, sequence_parallel=True, async_tp=True)
    with pytest.raises(UsageError, match="add --pointwise fused"):
        evaluate(ModelRequest("gpt2"), TraceOptions(), execution, load_gpu("h100"), cluster_for_gpu("h100"))
