"""Transformer Engine's FP8 linears keep their inputs for backward in FP8
(``trace.fp8_saved_inputs``), in Megatron-LM's layouts; torchtitan's float8 (torchao) keeps
them in 16 bits. Each saved-bytes difference is counted by hand from the tiny Llama's shapes:
per block, the q-k-v input and the feed-forward input (the norms' outputs) and the down
projection's input shrink from 2 bytes an element to 1, and the attention output, which the
attention also keeps for its own backward, gains a 1-byte copy."""

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
    them under sequence parallelism) and of the down projection's input, less the attention
    output's FP8 copy."""
    tokens, shard = BATCH * SEQ, BATCH * SEQ // tensor
    dim, ffn = LLAMA["dim"], LLAMA["ffn_hidden"]
    return 2 * shard * dim + tokens * ffn // tensor - tokens * dim // tensor


@pytest.mark.parametrize("tensor", [1, 2])
def test_megatron_layouts_keep_fp8_inputs(tensor):
    execution = Execution(world=2 * tensor, data="zero1", tensor=tensor, sequence_parallel=tensor > 1,
                          micro_batch=BATCH)
    assert execution.megatron_layout
    sixteen, fp8 = _trace(execution, fp8=False), _trace(execution, fp8=True)
    assert fp8.trace.config["fp8_saved_inputs"] == 4 * LLAMA["n_layer"]  # q-k-v, wo, w1-w3, w2
    assert "fp8_saved_inputs" not in sixteen.trace.config
    assert _blocks_saved(sixteen) - _blocks_saved(fp8) == LLAMA["n_layer"] * _fp8_saving_per_block(tensor)
    # nothing else moves: the same events, and a smaller peak
    assert [e.name for e in fp8.trace.events] == [e.name for e in sixteen.trace.events]
    assert predict_memory(fp8.trace).peak_allocated < predict_memory(sixteen.trace).peak_allocated


def test_torchtitans_float8_keeps_sixteen_bit_inputs():
    """torchao's ``matmul_with_hp_or_float8_args`` saves ``input_hp``: FSDP2's layouts (and one
    GPU) keep what the trace keeps."""
    execution = Execution(world=2, data="fsdp", shard=2, micro_batch=BATCH)
    assert not execution.megatron_layout
    fp8 = _trace(execution, fp8=True)
    assert "fp8_saved_inputs" not in fp8.trace.config
    assert _blocks_saved(fp8) == _blocks_saved(_trace(execution, fp8=False))
