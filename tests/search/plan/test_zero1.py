"""ZeRO-1 in the plan (Megatron-LM's distributed optimizer, trace.parallel.distributed_optimizer):
a deep stack from two shallow traces against the stack traced whole, the even shares adding up
to DDP's optimizer state, the parameters' all-gathers overlapping the next forward, and the
search's states bound."""

from __future__ import annotations

import pytest

from nnperf.hardware.catalog import load_gpu
from nnperf.hardware.cluster import load_cluster
from nnperf.layout import Execution
from nnperf.loading import resolve
from nnperf.request import ModelRequest
from nnperf.search.plan import plan
from nnperf.search.plan.rank import rank_cost, scaled_cost
from nnperf.search.plan.states import states_bound
from nnperf.trace.distributed import trace_rank
from nnperf.trace.options import TraceOptions

GPU, CLUSTER = load_gpu("h100"), load_cluster("dgx-h100")
OPTIONS = TraceOptions(amp="bf16")
WORLD = 4
ZERO1 = Execution(world=WORLD, data="zero1", micro_batch=2)
SMALL_VOCAB = {"dim": 128, "n_heads": 4, "ffn_hidden": 256, "vocab": 512}  # blocks outweigh the embedding


def _request(overrides: dict, layers: int) -> ModelRequest:
    return ModelRequest("llama-7b", batch=2, seq_len=64, overrides={**overrides, "n_layer": layers})


def test_a_deep_stack_from_two_shallow_traces():
    """Depth 7 from depths 3 and 4, against depth 7 traced whole: every rank holds an even share
    of every bucket, so the shares add up per block like the buckets (within the few elements an
    odd bucket leaves to every rank), step and memory within 1%."""
    request = _request(SMALL_VOCAB, 7)
    direct = rank_cost(request, OPTIONS, ZERO1, GPU, CLUSTER)
    scaled = scaled_cost(request, OPTIONS, ZERO1, GPU, CLUSTER, 0, layers=7, per_chunk=7)
    assert scaled is not direct and scaled.per_block  # extrapolated, not traced whole
    s, d = scaled.figures, direct.figures
    assert abs(s.states.optimizer_state - d.states.optimizer_state) <= 8 * 4 * WORLD
    assert s.states.parameters == d.states.parameters
    assert s.step_s == pytest.approx(d.step_s, rel=0.01)
    assert s.memory == pytest.approx(d.memory, rel=0.01)


def test_a_deep_stack_accumulates_with_its_update_once():
    """A wider stack on short sequences, 8 blocks from 3 and 4 against 8 traced whole: memory
    within 1.5%; the step within 2% with 1 and with 4 micro-batches (the update runs once). The
    allocated peak of each phase is linear in the blocks; what the caching allocator reserves
    beyond it is not (689, 722 and 690 MB at 3, 4 and 8 blocks), and the extrapolation keeps the
    larger of the traced depths' (``RankFigures.mem_outside``): 1.3% over here."""
    from nnperf.search.plan import evaluate
    from nnperf.search.plan.rank import RoleCache

    request = _request({"dim": 1024, "n_heads": 8, "ffn_hidden": 2816, "vocab": 32768}, 8)
    request = ModelRequest(request.target, batch=1, seq_len=64, overrides=request.overrides)
    for accum in (1, 4):
        execution = Execution(world=WORLD, data="zero1", micro_batch=1, grad_accum=accum)
        scaled = evaluate(request, OPTIONS, execution, GPU, CLUSTER, layers=8, cache=RoleCache())
        direct = evaluate(request, OPTIONS, execution, GPU, CLUSTER, cache=RoleCache())
        assert scaled.memory_bytes == pytest.approx(direct.memory_bytes, rel=0.015)
        assert scaled.step_s == pytest.approx(direct.step_s, rel=0.02)


def test_no_optimizer_has_no_zero1():
    from nnperf.errors import UsageError

    request = _request(SMALL_VOCAB, 3)
    with pytest.raises(UsageError, match="zero1 shards the optimizer state"):
        rank_cost(request, TraceOptions(amp="bf16", optimizer="none"), ZERO1, GPU, CLUSTER)
    with pytest.raises(UsageError, match="--data zero1 shards the optimizer state"):
        plan(request, TraceOptions(amp="bf16", optimizer="none"), GPU, WORLD, CLUSTER, global_batch=8, data=["zero1"])
    found = plan(request, TraceOptions(amp="bf16", optimizer="none"), GPU, WORLD, CLUSTER, global_batch=8,
                 tensor=[1], pipeline=[1])
    assert "zero1" not in {p.execution.data for p in found.ranked + found.rejected}


def test_the_shares_add_up_to_ddp_state():
    """Every rank's share of the moments, summed, is DDP's (AdamW: two fp32 moments per element;
    a step counter per updated tensor: one per bucket and rank here, one per parameter under
    DDP); the ranks' shares are even."""
    request = _request(SMALL_VOCAB, 3)
    _, build = resolve(request)
    params = list(build().model.parameters())
    shares = [_state(build, ZERO1, rank) for rank in range(WORLD)]
    assert len(set(shares)) == 1
    buckets = len([c for c in _traced(build, ZERO1, 0).collectives if c.kind == "reduce_scatter"])
    assert sum(shares) - 4 * WORLD * buckets == _state(build, Execution(world=WORLD, data="ddp", micro_batch=2), 0) \
        - 4 * len(params)


def _traced(build, execution, rank):
    from nnperf.trace.blocks import repeated_blocks

    return trace_rank(build, OPTIONS, execution, repeated_blocks, rank=rank)


def _state(build, execution, rank):
    from nnperf.trace.distributed import sharded_bytes

    return sharded_bytes(_traced(build, execution, rank))["optimizer_state"]


def test_the_parameters_are_gathered_as_the_next_forward_needs_them():
    """Megatron-LM's --overlap-param-gather: each bucket's all-gather is issued as the forward
    starts and the forward's kernels wait only for the bucket they read (each all-gather given
    1 ms here): the first block's matrix product starts before the last bucket arrives."""
    from nnperf.analysis import Analysis
    from nnperf.passes.comm_timeline import overlap
    from nnperf.prediction import predict_analysis
    from nnperf.trace.blocks import repeated_blocks

    request = _request(SMALL_VOCAB, 3)
    name, build = resolve(request)
    execution = Execution(world=WORLD, data="zero1", micro_batch=2, bucket_bytes=2**20)  # several buckets
    traced = trace_rank(build, OPTIONS, execution, repeated_blocks)
    by_index = {c.index: c for c in traced.collectives}
    prediction = predict_analysis(Analysis.from_trace(name, OPTIONS, traced.trace, traced.workload), GPU)
    comm = overlap(prediction.step, traced.trace, lambda i: (by_index[i].kind, by_index[i].bytes, 1e-3),
                   stream_of=lambda i: by_index[i].stream)
    gathers = [s for s in comm.slices if s.kind == "all_gather"]
    assert len(gathers) > 2 and all(traced.trace.events[s.index].phase == "forward" for s in gathers)
    first_mm = next(t for t in prediction.step.ops if t.phase == "forward" and t.count.event.name in ("aten.mm", "aten.addmm"))
    assert comm.clock[first_mm.index] < max(s.end_s for s in gathers)


def test_the_plan_searches_zero1_and_bounds_it_from_fsdp():
    """ZeRO-1 holds DDP's parameters and gradients and a quarter of its optimizer state: in the
    ranking beside DDP and FSDP; its states bound, from the FSDP trace, is at most its traced
    memory."""
    request = _request(SMALL_VOCAB, 3)
    found = plan(request, OPTIONS, GPU, WORLD, CLUSTER, global_batch=8, data=["ddp", "zero1", "fsdp"])
    by_kind = {p.execution.data: p for p in found.ranked if p.execution.micro_batch == 2}
    assert set(by_kind) == {"ddp", "zero1", "fsdp"}
    ddp, zero1, fsdp = by_kind["ddp"], by_kind["zero1"], by_kind["fsdp"]
    assert zero1.state_bytes.parameters == ddp.state_bytes.parameters
    assert zero1.state_bytes.optimizer_state < ddp.state_bytes.optimizer_state / 2
    bound = states_bound(fsdp, fsdp.execution.shard, zero1.execution, "adamw")
    assert bound is not None and bound <= zero1.memory_bytes


def test_the_gradient_buckets_live_through_the_step():
    """ZeRO-1's gradients are views of DDP's buckets, allocated before the step and kept by DDP
    when zero_grad drops the views: every phase of the step holds the parameters, the gradients
    and the state (the memory pass dropped the buckets at the first step's end)."""
    cost = rank_cost(_request(SMALL_VOCAB, 3), OPTIONS, ZERO1, GPU, CLUSTER)
    states = cost.figures.states
    assert min(cost.figures.memory_by_phase.values()) >= states.total


def test_a_pipeline_synchronizes_its_data_parallel_ranks_once_per_step():
    """4 stages x 8 micro-batches, DDP over 2 ranks per stage: the gradients' all-reduce a
    traced micro-batch waits for at the end of its backward is the step's tail, not every
    backward's, and so are the copies into DDP's buckets: the backward action is the one no_sync
    runs (within 3% of the pipeline's backward without data parallelism: what DDP's autograd
    hooks still cost the host) and the tail holds the synchronization."""
    from nnperf.search.plan.rank import RoleCache, scaled_cost

    request = _request(SMALL_VOCAB, 12)
    role = Execution(world=6, data="ddp", pipeline=3, pipeline_schedule="gpipe", micro_batch=2)
    alone = Execution(world=3, data="ddp", pipeline=3, pipeline_schedule="gpipe", micro_batch=2)
    ddp = scaled_cost(request, OPTIONS, role, GPU, CLUSTER, 0, 12, RoleCache(), per_chunk=4)
    plain = scaled_cost(request, OPTIONS, alone, GPU, CLUSTER, 0, 12, RoleCache(), per_chunk=4)
    assert ddp.figures.action("B", 0) == pytest.approx(plain.figures.action("B", 0), rel=0.03)
    assert ddp.figures.tail_s > plain.figures.tail_s  # the synchronization, once


def test_a_pipeline_stage_with_zero1_runs_the_same_blocks_as_with_ddp():
    """ZeRO-1's once-per-step work is its buckets' reduction and its parameters' all-gather:
    every other kernel of a micro-batch (the blocks reading the gathered parameters) stays in its
    actions, which run what DDP's do (within 3%)."""
    from nnperf.search.plan.rank import RoleCache, scaled_cost

    request = _request(SMALL_VOCAB, 12)
    for_kind = {}
    for data in ("ddp", "zero1"):
        role = Execution(world=6, data=data, pipeline=3, pipeline_schedule="gpipe", micro_batch=2)
        for_kind[data] = scaled_cost(request, OPTIONS, role, GPU, CLUSTER, 0, 12, RoleCache(), per_chunk=4).figures
    for kind in ("F", "B"):
        assert for_kind["zero1"].action(kind, 0) == pytest.approx(for_kind["ddp"].action(kind, 0), rel=0.03)
