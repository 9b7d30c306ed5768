"""Transformer Engine's FP8 linears keep their inputs for backward in FP8
(``trace.fp8_saved_inputs``), in Megatron-LM's layouts; torchtitan's float8 (torchao) keeps
them in 16 bits. Each saved-bytes difference is counted by hand from the tiny Llama's shapes:
per block, the q-k-v input and the feed-forward input (the norms' outputs) and the down
projection's input shrink from 2 bytes an element to 1; the attention output, which the
attention keeps for its own backward, is what the output projection saves too (Megatron-Core's
``set_save_original_input``): no copy, cast again in backward. The experts' GroupedLinear keeps
its routed tokens and its down projection's input in FP8."""

from __future__ import annotations

import pytest

from nnperf.layout import Execution
from nnperf.passes.memory.model import classify, predict_memory, saved_activations_by_module
from nnperf.trace.distributed import trace_rank
from nnperf.trace.options import TraceOptions

LLAMA = {"n_layer": 2, "dim": 32, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 48, "vocab": 101}
BATCH, SEQ = 2, 16


def _trace(execution: Execution, fp8: bool):
    from nnperf.zoo import get_model

    return trace_rank(lambda: get_model("llama-7b").build(batch=BATCH, seq_len=SEQ, **LLAMA),
                      TraceOptions(optimizer="adamw", dtype="bf16", fp8=fp8), execution, lambda model: [])


def _blocks_saved(traced) -> int:
    by_module = saved_activations_by_module(traced.trace, classify(traced.trace))
    return sum(saved for module, saved in by_module.items() if module.removeprefix("module.").startswith("layers."))


def _fp8_saving_per_block(tensor: int) -> int:
    """Bytes a block saves less: one byte an element of the two norm outputs (a sequence shard of
    them under sequence parallelism) and of the down projection's input."""
    tokens, shard = BATCH * SEQ, BATCH * SEQ // tensor
    dim, ffn = LLAMA["dim"], LLAMA["ffn_hidden"]
    return 2 * shard * dim + tokens * ffn // tensor


@pytest.mark.parametrize("tensor", [1, 2])
def test_megatron_layouts_keep_fp8_inputs(tensor):
    execution = Execution(world=2 * tensor, data="zero1", tensor=tensor, sequence_parallel=tensor > 1,
                          micro_batch=BATCH)
    assert execution.megatron_layout
    sixteen, fp8 = _trace(execution, fp8=False), _trace(execution, fp8=True)
    config = fp8.trace.config
    assert config["fp8_saved_inputs"] == 3 * LLAMA["n_layer"]  # q-k-v, w1-w3, w2
    assert "fp8_saved_inputs" not in sixteen.trace.config
    assert _blocks_saved(sixteen) - _blocks_saved(fp8) == LLAMA["n_layer"] * _fp8_saving_per_block(tensor)
    # wo saves the attention's output as it is: its weight gradient casts that again (its
    # tokens x the rank's heads), its forward cast writes row-wise data only
    events = fp8.trace.events
    recast = config["fp8_recast_inputs"]
    assert sorted(events[i].module.removeprefix("module.") for i in recast) == [
        f"layers.{i}.attention.wo" for i in range(LLAMA["n_layer"])]
    assert set(recast.values()) == {BATCH * SEQ * LLAMA["dim"] // tensor}
    assert all(str(events[i].phase) == "backward" for i in recast)
    rowwise = config["fp8_rowwise_casts"]
    assert sorted(events[i].module.removeprefix("module.") for i in rowwise) == [
        f"layers.{i}.attention.wo" for i in range(LLAMA["n_layer"])]
    assert all(str(events[i].phase) == "forward" for i in rowwise)
    # nothing else moves: the same events, and a smaller peak
    assert [e.name for e in fp8.trace.events] == [e.name for e in sixteen.trace.events]
    assert predict_memory(fp8.trace).peak_allocated < predict_memory(sixteen.trace).peak_allocated


def test_megatron_layouts_keep_the_experts_inputs_in_fp8():
    """TE's GroupedLinear saves its quantized inputs (column-wise) in FP8: per block, the routed
    tokens (every token top_k times, each a row of dim) and the experts' down projection's input
    (a row of moe_hidden per routed token) shrink from 2 bytes an element to 1, on top of the
    attention's linears' savings (q-k-v input, none for wo); the router keeps its 16-bit input."""
    moe = {"n_experts": 4, "top_k": 2, "moe_hidden": 16}
    execution = Execution(world=2, data="zero1", micro_batch=BATCH)

    def trace(fp8: bool):
        from nnperf.zoo import get_model

        return trace_rank(lambda: get_model("llama-7b").build(batch=BATCH, seq_len=SEQ, **LLAMA, **moe),
                          TraceOptions(optimizer="adamw", dtype="bf16", fp8=fp8), execution, lambda model: [])

    sixteen, fp8 = trace(False), trace(True)
    tokens, routed = BATCH * SEQ, BATCH * SEQ * moe["top_k"]
    per_block = tokens * LLAMA["dim"] + routed * LLAMA["dim"] + routed * moe["moe_hidden"]
    assert fp8.trace.config["fp8_saved_inputs"] == 3 * LLAMA["n_layer"]  # q-k-v, experts' in, down's in
    assert _blocks_saved(sixteen) - _blocks_saved(fp8) == LLAMA["n_layer"] * per_block
    # the experts keep FP8 copies: none of their GEMMs casts a saved original
    events, config = fp8.trace.events, fp8.trace.config
    recasting = {*config["fp8_recast_inputs"], *config["fp8_rowwise_casts"]}
    assert not any(events[i].name == "aten._grouped_mm" for i in recasting)


def test_the_output_projection_saves_its_input_under_selective_recomputation_too():
    """Megatron-Core asks ``linear_proj`` to save its 16-bit input whether or not the core
    attention is recomputed (attention.py): with the attention recomputed in backward (nothing
    else keeps its output), wo still holds no FP8 copy and casts the saved input again."""
    from nnperf.search.plan.evaluate import prepare_for
    from nnperf.trace.blocks import repeated_blocks
    from nnperf.zoo import get_model

    execution = Execution(world=2, data="zero1", micro_batch=BATCH, checkpoint="selective-attention")
    traced = trace_rank(lambda: get_model("llama-7b").build(batch=BATCH, seq_len=SEQ, **LLAMA),
                        TraceOptions(optimizer="adamw", dtype="bf16", fp8=True), execution, repeated_blocks,
                        prepare_for(execution))
    events, config = traced.trace.events, traced.trace.config
    assert any(e.recomputed and e.name == "nnperf.attention" for e in events)  # recomputed indeed
    assert config["fp8_saved_inputs"] == 3 * LLAMA["n_layer"]  # q-k-v, w1-w3, w2
    assert sorted(events[i].module.removeprefix("module.") for i in config["fp8_recast_inputs"]) == [
        f"layers.{i}.attention.wo" for i in range(LLAMA["n_layer"])]


def test_torchtitans_float8_keeps_sixteen_bit_inputs():
    """torchao's ``matmul_with_hp_or_float8_args`` saves ``input_hp``: FSDP2's layouts (and one
    GPU) keep what the trace keeps."""
    execution = Execution(world=2, data="fsdp", shard=2, micro_batch=BATCH)
    assert not execution.megatron_layout
    fp8 = _trace(execution, fp8=True)
    assert "fp8_saved_inputs" not in fp8.trace.config
    assert _blocks_saved(fp8) == _blocks_saved(_trace(execution, fp8=False))
