"""The engines' patches for tracing on fake tensors: DTensor's sharding decisions of foreach
ops (an optimizer step over every parameter) taken element by element give DTensor's own
decision on the whole list, and the trace they give is the one DTensor's gives."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from torch.distributed.tensor._sharding_prop import ShardingPropagator

from nnperf.layout import Execution
from nnperf.trace import engine_patches
from nnperf.trace.blocks import repeated_blocks
from nnperf.trace.distributed import trace_rank
from nnperf.trace.fake_world import sharding_propagator
from nnperf.trace.options import TraceOptions
from nnperf.zoo import get_model

#: FSDP2 over a tensor-parallel mesh: every optimizer list holds parameters of several shardings
LAYOUT = Execution(world=4, data="fsdp", shard=2, tensor=2, sequence_parallel=True)


def _build():
    return get_model("llama-7b").build(batch=2, seq_len=16, n_layer=2, dim=64, n_heads=4, n_kv_heads=2,
                                       ffn_hidden=96, vocab=64)


def _events(trace) -> list[tuple]:
    return [(e.name, e.phase, tuple(tuple(m.shape) for m in e.inputs), tuple(tuple(m.shape) for m in e.outputs),
             e.subclass_dispatches, e.subclass_list_tensors) for e in trace.events]


def test_foreach_decisions_by_element_are_dtensors_own(monkeypatch):
    by_element = engine_patches.foreach_by_element
    compared: list[tuple[str, object, object]] = []

    def checking(op_schema, decide):
        result = by_element(op_schema, decide)
        if result is not None:  # DTensor's decision on the whole list, uncached
            whole = ShardingPropagator.propagate_op_sharding_non_cached(sharding_propagator(), op_schema)
            compared.append((str(op_schema.op), result, whole))
        return result

    monkeypatch.setattr(engine_patches, "foreach_by_element", checking)
    trace_rank(_build, TraceOptions(), LAYOUT, repeated_blocks)
    ops = {op for op, _, _ in compared}
    # AdamW's foreach ops, in place (no output) and not (the square roots)
    assert {"aten._foreach_lerp_.Scalar", "aten._foreach_addcdiv_.ScalarList", "aten._foreach_sqrt.default"} <= ops
    for op, result, whole in compared:
        assert result == whole, op


def test_a_trace_is_the_same_with_decisions_by_element(monkeypatch):
    fast = trace_rank(_build, TraceOptions(), LAYOUT, repeated_blocks).trace
    monkeypatch.setattr(engine_patches, "foreach_by_element", lambda op_schema, decide: None)
    whole = trace_rank(_build, TraceOptions(), LAYOUT, repeated_blocks).trace
    assert any(e.name.startswith("aten._foreach_") for e in fast.events)
    assert _events(fast) == _events(whole)


def test_keyword_arguments_are_left_to_dtensor():
    schema = SimpleNamespace(op="aten._foreach_add_.List", kwargs_schema={"alpha": 2.0}, args_schema=([], []))
    assert engine_patches.foreach_by_element(schema, lambda s: pytest.fail("decided")) is None
