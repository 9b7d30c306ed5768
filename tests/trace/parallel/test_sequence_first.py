"""The copies a batch-first trace makes around Megatron-LM's sequence-parallel collectives
(``trace.parallel.sequence_first``): listed for a Megatron-LM layout and counted with no kernel.
Expected counts by hand from the tiny Llama: it reduce-scatters along the sequence each block's
two outputs (attention's ``wo``, the MLP's ``w2``) and the embedding's output in forward, each
block's two input gradients and the output projection's in backward (10 with two blocks), every
one after a concatenation; DTensor gathers each block's two inputs and the output
projection's in forward, and the gradients of what was reduce-scattered in forward in
backward (10), each concatenated along the sequence unless the micro-batch holds one sample;
and nnperf's Megatron-LM linears, with two samples, reorder the output gradient of each
column-parallel linear (q, k, v; w1, w3) for its weight gradient."""

from __future__ import annotations

import pytest

from nnperf.layout import Execution
from nnperf.passes.count import count_ops
from nnperf.trace.distributed import trace_rank
from nnperf.trace.options import TraceOptions

pytestmark = pytest.mark.process

LLAMA = {"n_layer": 2, "dim": 32, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 48, "vocab": 101}
SEQ, TP = 16, 2


def _trace(execution: Execution, batch: int):
    from nnperf.zoo import get_model

    return trace_rank(lambda: get_model("llama-7b").build(batch=batch, seq_len=SEQ, **LLAMA),
                      TraceOptions(optimizer="adamw"), execution, lambda model: [])


def _in_blocks(event) -> bool:
    return event.module.removeprefix("module.").startswith("layers.")


@pytest.mark.parametrize("batch", [1, 2])
def test_megatron_layouts_list_the_batch_first_copies(batch):
    traced = _trace(Execution(world=2 * TP, data="zero1", tensor=TP, sequence_parallel=True, micro_batch=batch),
                    batch)
    events = traced.trace.events
    listed = [events[i] for i in traced.trace.config["not_copied"]]
    blocks = LLAMA["n_layer"]
    cats = [e for e in listed if e.name == "aten.cat"]
    clones = [e for e in listed if e.name == "aten.clone"]
    scatters = 4 * blocks + 2
    dtensor_gathers = 4 * blocks + 2
    assert len(cats) == scatters + (dtensor_gathers if batch > 1 else 0)
    assert len(clones) == (5 * blocks if batch > 1 else 0)
    assert len(listed) == len(cats) + len(clones)
    counts = {c.event.index: c for c in count_ops(traced.trace)}
    for event in listed:  # each a buffer, not a copy
        assert counts[event.index].category == "alloc" and counts[event.index].bytes == 0


def test_torchtitan_layouts_keep_their_copies():
    """DTensor's batch-first sequence parallelism is what torchtitan runs: its copies are its own."""
    traced = _trace(Execution(world=TP, tensor=TP, sequence_parallel=True, micro_batch=2), 2)
    assert "not_copied" not in traced.trace.config
    assert any(e.name == "aten.cat" and _in_blocks(e) for e in traced.trace.events)


def test_a_megatron_layout_lists_its_copies_after_another_layouts_trace():
    """A plan's search traces FSDP's TP x shard mesh, then ZeRO-1's TP x replicate one, in one
    process: DTensor, which caches its sharding by mesh and finds the earlier TP mesh equal (the
    same ranks and name), issues the later trace's tensor-parallel collectives over the earlier
    mesh's group. The ZeRO-1 layout still lists its copies, as many as traced alone (by hand, as
    above: 10 reduce-scatters and 10 gathers concatenated, 10 clones), and its collectives name
    its own tensor-parallel group."""
    _trace(Execution(world=2 * TP, data="fsdp", tensor=TP, sequence_parallel=True, micro_batch=2), 2)
    traced = _trace(Execution(world=2 * TP, data="zero1", tensor=TP, sequence_parallel=True, micro_batch=2), 2)
    blocks = LLAMA["n_layer"]
    assert len(traced.trace.config["not_copied"]) == 2 * (4 * blocks + 2) + 5 * blocks
    group = traced.trace.config["tensor_parallel_group"]
    assert sum(c.group == group for c in traced.collectives) >= 2 * (4 * blocks + 2)
