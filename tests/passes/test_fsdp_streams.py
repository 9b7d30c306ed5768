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
    CHUNK_CAT,
    COPY_IN_STREAM,
    REDUCE_SCATTER_STREAM,
    copy_in_stream_events,
    engine_streams,
    engine_waits,
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


def test_fsdp2s_streams_wait_for_its_copy_outs_and_reductions():
    """``wait_for_unshard`` makes the gather streams wait for a copy-out: in forward the one two
    units back (issued after this unit's gather), in backward this unit's own (before it
    prefetches the next); ``post_backward`` makes the compute stream wait for the reduce-scatter
    before it fills the next reduce-scatter input. The root, then the two blocks, are
    gathered in forward; the blocks again in backward; the blocks and then the root reduced."""
    trace = _trace("bf16")
    waits = engine_waits(trace)
    events = trace.events
    copy_outs = [e.index for e in events if e.name == "fsdp.split_with_sizes_copy"]
    gathers = [e for e in events if e.name == "c10d._allgather_base_"]
    forward = [g for g in gathers if g.phase == "forward"]
    backward = [g for g in gathers if g.phase == "backward"]
    assert len(forward) == 1 + LLAMA["n_layer"] and len(backward) == LLAMA["n_layer"]
    assert [waits.get(g.index) for g in forward] == [None, None, copy_outs[0]]  # block 1's: the root's
    # the last block's, prefetched from the root's pre-backward: the last forward copy-out (its
    # own, through the root's post-forward wait); then block 0's, prefetched from block 1's
    # pre-backward: block 1's backward copy-out
    held = [(events[waits[g.index]].module, str(events[waits[g.index]].phase)) for g in backward]
    assert held == [("layers.1", "forward"), ("layers.1", "backward")]
    for g in gathers:  # its copy-in stream's kernels (the cast, the copy-in) wait with it
        chain = [i for i in copy_in_stream_events(trace) if max((h.index for h in gathers if h.index < g.index),
                                                                 default=-1) < i < g.index]
        assert len(chain) == 2 and {waits.get(i) for i in chain} == {waits.get(g.index)}
    reduces = [e.index for e in events if e.name == "c10d._reduce_scatter_base_"]
    fills = [e.index for e in events if e.name == CHUNK_CAT]
    assert len(fills) == len(reduces) == 1 + LLAMA["n_layer"]
    assert [waits.get(i) for i in fills] == [None, *reduces[:-1]]


def test_a_moes_expert_gathers_share_the_all_gather_stream():
    """Mixtral on 4 ranks, FSDP2 over 4 with experts split over 2: the experts are sharded over
    the other 2 (torchtitan's ``dp_shard_mod_ep``), a group of their own. Their gathers and
    reduce-scatters run on FSDP2's streams beside the dense group's; the expert all-to-alls
    (functional collectives of the expert group) on none."""
    from nnperf.search.plan import prepare_for

    execution = Execution(world=4, data="fsdp", shard=4, expert=2)
    traced = trace_rank(lambda: get_model("mixtral-8x7b").build(1, 16, n_layer=2, dim=16, n_heads=4, n_kv_heads=2,
                                                               ffn_hidden=24, vocab=64),
                        TraceOptions(optimizer="adamw"), execution, lambda m: ["layers.0", "layers.1"],
                        prepare_for(execution))
    streams = engine_streams(traced.trace)
    on = {c.group_size: set() for c in traced.collectives}
    for c in traced.collectives:
        on[c.group_size].add((c.kind, streams.get(c.index)))
    assert {s for k, s in on[4] | on[2] if k == "all_gather"} == {ALL_GATHER_STREAM}
    assert {s for k, s in on[4] | on[2] if k == "reduce_scatter"} == {REDUCE_SCATTER_STREAM}
    assert ("all_gather", ALL_GATHER_STREAM) in on[2] and ("all_gather", ALL_GATHER_STREAM) in on[4]
    assert {s for k, s in on[2] if k == "all_to_all"} == {None}


@pytest.mark.parametrize("execution", [
    Execution(world=4, data="ddp", tensor=2, sequence_parallel=True, micro_batch=2),
    Execution(world=4, data="zero1", tensor=2, sequence_parallel=True, micro_batch=2),
    Execution(world=4, data="ddp", pipeline=2, pipeline_schedule="1f1b", micro_batch=1, grad_accum=2),
], ids=["ddp-tp", "zero1-tp", "ddp-pipeline"])
def test_no_other_engines_collective_is_on_fsdp2s_streams(execution):
    """DDP's bucket all-reduces, ZeRO-1's reduce-scatters and gathers, DTensor's tensor-parallel
    collectives and the pipeline's sends fill no FSDP2 buffer: none is on its streams."""
    trace = trace_rank(lambda: get_model("llama-7b").build(batch=2, seq_len=64, **LLAMA), TraceOptions(amp="bf16"),
                       execution, repeated_blocks, prepare_for(execution)).trace
    assert any(e.name.startswith(("c10d.", "_c10d_functional.")) for e in trace.events)
    assert engine_streams(trace) == {} and engine_waits(trace) == {}
