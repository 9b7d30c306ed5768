"""Which kernels and collectives FSDP2 runs on its side streams (``passes.fsdp_streams``), and
the copy-in's own kernel, against the shards sized by hand. Traces small FSDP2 ranks and one
pipeline rank (seconds)."""

from __future__ import annotations

import pytest

from nnperf.layout import Execution
from nnperf.passes.count import count_ops
from nnperf.passes.fsdp_streams import (
    ALL_GATHER_COPY_IN,
    ALL_GATHER_STREAM,
    ALL_REDUCE_STREAM,
    COPY_IN_STREAM,
    REDUCE_SCATTER_STREAM,
    copy_in_stream_events,
    engine_streams,
)
from nnperf.search.plan import prepare_for
from nnperf.trace.blocks import repeated_blocks
from nnperf.trace.distributed import trace_rank
from nnperf.trace.options import TraceOptions
from nnperf.zoo import get_model

DIM, FFN, SHARDS = 128, 256, 4
LLAMA = {"n_layer": 2, "dim": DIM, "n_heads": 4, "ffn_hidden": FFN, "vocab": 512}
#: a block's parameters: four attention projections, three FFN projections, two norms
BLOCK = 4 * DIM * DIM + 3 * DIM * FFN + 2 * DIM
#: the root's: the embedding, the output projection and the final norm
ROOT = 2 * LLAMA["vocab"] * DIM + DIM
#: the gathers of one step: the root once, each block in forward and again before its backward
GATHERS = 1 + 2 * LLAMA["n_layer"]


def _trace(amp: str | None):
    return trace_rank(lambda: get_model("llama-7b").build(batch=2, seq_len=64, **LLAMA), TraceOptions(amp=amp),
                      Execution(world=SHARDS, data="fsdp", shard=SHARDS, micro_batch=2),
                      lambda model: [f"layers.{i}" for i in range(LLAMA["n_layer"])]).trace


@pytest.mark.parametrize("amp, itemsize", [("bf16", 2), (None, 4)])
def test_the_copy_in_is_a_kernel_copying_the_shards_not_the_whole_buffer(amp, itemsize):
    """Its meta kernel returns views of the buffer it is given; its CUDA kernel copies the
    rank's shards (a quarter of each unit, in the parameter dtype) into that buffer's slice."""
    trace = _trace(amp)
    assert [e.free for e in trace.events if e.name == ALL_GATHER_COPY_IN] == [False] * GATHERS
    counts = [c for c in count_ops(trace) if c.event.name == ALL_GATHER_COPY_IN]
    shards = sorted([ROOT * itemsize // SHARDS] + [BLOCK * itemsize // SHARDS] * (GATHERS - 1))
    assert sorted(c.bytes_out for c in counts) == shards
    assert sorted(c.bytes_in + c.bytes_weights for c in counts) == shards


def test_under_mixed_precision_the_cast_of_the_shards_runs_there_too():
    """With a parameter dtype FSDP2 first casts the fp32 shards into a flat bf16 buffer (one
    foreach copy a gather), on the copy-in stream: each copy-in and each cast, nothing else."""
    trace = _trace("bf16")
    names = [trace.events[i].name for i in sorted(copy_in_stream_events(trace))]
    assert names.count(ALL_GATHER_COPY_IN) == GATHERS
    assert names.count("aten._foreach_copy_") == GATHERS and len(names) == 2 * GATHERS


def test_without_a_parameter_dtype_only_the_copy_ins_run_there():
    """fp32 shards are gathered as they are: no cast, the copy-in reads the shards."""
    trace = _trace(None)
    assert [trace.events[i].name for i in sorted(copy_in_stream_events(trace))] == [ALL_GATHER_COPY_IN] * GATHERS


def test_the_pipeline_runtimes_own_gathers_run_on_the_compute_stream():
    """torch's pipeline runtime gathers a stage's parameters in its ``UNSHARD`` actions, before
    the schedule's first forward, with ``unshard(async_op=True)``: on the current stream. An
    interleaved pipeline that does not reshard after forward gathers its two chunks there only
    (one copy-in each, before the first action), so nothing runs on the copy-in stream."""
    execution = Execution(world=4, data="fsdp", shard=2, pipeline=2, pipeline_schedule="interleaved-1f1b",
                          virtual_stages=2, micro_batch=1, grad_accum=4, reshard_after_forward=False)
    trace = trace_rank(lambda: get_model("llama-7b").build(batch=4, seq_len=64, **{**LLAMA, "n_layer": 4}),
                       TraceOptions(amp="bf16"), execution, repeated_blocks, prepare_for(execution)).trace
    first_action = min(start for _, start, _ in trace.config["pipeline_actions"])
    copy_ins = [e.index for e in trace.events if e.name == ALL_GATHER_COPY_IN]
    assert len(copy_ins) == 2 and max(copy_ins) < first_action
    assert copy_in_stream_events(trace) == frozenset()
    streams = engine_streams(trace)  # its gradients are still reduce-scattered on FSDP2's stream
    assert set(streams.values()) == {REDUCE_SCATTER_STREAM} and len(streams) == 2


def _on(trace, streams, stream) -> list[str]:
    return sorted(trace.events[i].name for i, s in streams.items() if s is stream)


def test_fsdp2s_collectives_run_on_its_streams():
    """Every all-gather fills a buffer an implicit copy-in wrote (one a gather: the root once,
    each block twice), every reduce-scatter reads what ``fsdp.chunk_cat`` filled (one a unit);
    they run on FSDP2's all-gather and reduce-scatter streams, the copy-ins and casts on its
    copy-in stream, and nothing else on any."""
    trace = _trace("bf16")
    streams = engine_streams(trace)
    collectives = sorted(e.name for e in trace.events if e.name.startswith("c10d."))
    assert _on(trace, streams, ALL_GATHER_STREAM) == ["c10d._allgather_base_"] * GATHERS
    assert _on(trace, streams, REDUCE_SCATTER_STREAM) == ["c10d._reduce_scatter_base_"] * (1 + LLAMA["n_layer"])
    assert collectives == sorted(_on(trace, streams, ALL_GATHER_STREAM) + _on(trace, streams, REDUCE_SCATTER_STREAM))
    assert _on(trace, streams, COPY_IN_STREAM) == sorted([ALL_GATHER_COPY_IN, "aten._foreach_copy_"] * GATHERS)
    assert len(streams) == 3 * GATHERS + 1 + LLAMA["n_layer"]  # a copy-in, a cast, a gather; a unit's reduction


def test_hsdps_all_reduces_run_on_its_all_reduce_stream():
    """HSDP (2 shards x 2 replicas) reduce-scatters each unit's gradient over its shard group,
    then all-reduces the shard over the replicas: one all-reduce a unit, on the all-reduce
    stream."""
    trace = trace_rank(lambda: get_model("llama-7b").build(batch=2, seq_len=64, **LLAMA), TraceOptions(amp="bf16"),
                       Execution(world=4, data="hsdp", shard=2, micro_batch=2),
                       lambda model: [f"layers.{i}" for i in range(LLAMA["n_layer"])]).trace
    streams = engine_streams(trace)
    units = 1 + LLAMA["n_layer"]
    assert _on(trace, streams, REDUCE_SCATTER_STREAM) == ["c10d._reduce_scatter_base_"] * units
    assert _on(trace, streams, ALL_REDUCE_STREAM) == ["c10d.allreduce_"] * units
