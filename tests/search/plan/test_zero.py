"""ZeRO-1 in the plan: the busiest rank is the one reported, a deep stack's busiest rank comes
from two shallow traces (against the stack traced whole on that rank), the shares add up to
DDP's whole optimizer state, and the broadcasts wait for the update."""

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
from nnperf.search.plan.zero import busiest_rank
from nnperf.trace.distributed import trace_rank
from nnperf.trace.options import TraceOptions

GPU, CLUSTER = load_gpu("h100"), load_cluster("dgx-h100")
OPTIONS = TraceOptions(amp="bf16")
WORLD = 4
ZERO1 = Execution(world=WORLD, data="zero1", micro_batch=2)
SMALL_VOCAB = {"dim": 128, "n_heads": 4, "ffn_hidden": 256, "vocab": 512}  # blocks outweigh the embedding
LARGE_VOCAB = {**SMALL_VOCAB, "vocab": 32768}  # the embedding outweighs a rank's average share


def _request(overrides: dict, layers: int) -> ModelRequest:
    return ModelRequest("llama-7b", batch=2, seq_len=64, overrides={**overrides, "n_layer": layers})


@pytest.mark.parametrize("overrides", [SMALL_VOCAB, LARGE_VOCAB], ids=["blocks", "embedding"])
def test_a_deep_stack_is_its_busiest_rank(overrides):
    """Depth 7 from depths 3 and 4, against depth 7 traced whole on the rank with the largest
    share: optimizer state within one block parameter's (the greedy partition leaves the busiest
    rank within its last parameter of the average: at most the feed-forward's 128 x 256, at 8
    bytes of AdamW moments each), step and memory within 1%."""
    request = _request(overrides, 7)
    direct_rank0 = rank_cost(request, OPTIONS, ZERO1, GPU, CLUSTER)
    direct = rank_cost(request, OPTIONS, ZERO1, GPU, CLUSTER, rank=busiest_rank(direct_rank0))
    scaled = scaled_cost(request, OPTIONS, ZERO1, GPU, CLUSTER, 0, layers=7, per_chunk=7)
    assert scaled is not direct and scaled.per_block  # extrapolated, not traced whole
    s, d = scaled.figures, direct.figures
    assert abs(s.states.optimizer_state - d.states.optimizer_state) <= 8 * 128 * 256
    assert s.states.parameters == d.states.parameters
    assert s.step_s == pytest.approx(d.step_s, rel=0.01)
    assert s.memory == pytest.approx(d.memory, rel=0.01)


def test_a_deep_stack_whose_update_sets_the_peak_and_accumulates():
    """A wider stack on short sequences, where the optimizer step holds the most (the update's
    temporaries on top of the states), 8 blocks from 3 and 4 against 8 traced whole: memory
    within 1%; the step within 2% with 1 and with 4 micro-batches (the update runs once)."""
    from nnperf.search.plan import evaluate
    from nnperf.search.plan.rank import RoleCache

    request = _request({"dim": 1024, "n_heads": 8, "ffn_hidden": 2816, "vocab": 32768}, 8)
    request = ModelRequest(request.target, batch=1, seq_len=64, overrides=request.overrides)
    whole = rank_cost(request, OPTIONS, ZERO1, GPU, CLUSTER, rank=0)
    phases = whole.figures.memory_by_phase
    assert max(phases, key=phases.get) == "optimizer"
    for accum in (1, 4):
        execution = Execution(world=WORLD, data="zero1", micro_batch=1, grad_accum=accum)
        scaled = evaluate(request, OPTIONS, execution, GPU, CLUSTER, layers=8, cache=RoleCache())
        direct = evaluate(request, OPTIONS, execution, GPU, CLUSTER, cache=RoleCache())
        assert scaled.memory_bytes == pytest.approx(direct.memory_bytes, rel=0.01)
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


def test_the_busiest_rank_holds_the_embedding_when_it_outweighs_the_average():
    """With 32768 x 128 = 4.19 M embedding elements against fewer than 2 M per rank on average,
    rank 0 takes the embedding (the largest parameter, handed out first) and nothing else."""
    request = _request(LARGE_VOCAB, 3)
    cost = rank_cost(request, OPTIONS, ZERO1, GPU, CLUSTER)
    _, build = resolve(request)
    params = [p.numel() for p in build().model.parameters()]
    assert sum(params) / WORLD < 32768 * 128 == max(params)
    assert cost.optimizer_shares[0] == 32768 * 128 and busiest_rank(cost) == 0


def test_the_shares_add_up_to_ddp_state():
    """Every rank's optimizer state, summed, is DDP's (AdamW: two fp32 moments per element and a
    step counter per tensor, wherever the tensor is updated)."""
    request = _request(SMALL_VOCAB, 3)
    _, build = resolve(request)
    shares = sum(_state(build, ZERO1, rank) for rank in range(WORLD))
    assert shares == _state(build, Execution(world=WORLD, data="ddp", micro_batch=2), 0)


def _state(build, execution, rank):
    from nnperf.search.memory_variants import checkpoint_blocks
    from nnperf.trace.distributed import sharded_bytes

    return sharded_bytes(trace_rank(build, OPTIONS, execution, checkpoint_blocks, rank=rank))["optimizer_state"]


def test_the_broadcasts_wait_for_the_update():
    """ZeroRedundancyOptimizer broadcasts each share from the compute stream after the update,
    and ProcessGroupNCCL's stream waits for the kernels issued before: no broadcast starts before
    the update's last kernel ends, even those of other ranks' shares, whose buffers this rank
    last wrote in the previous step (each broadcast given 1 ms here)."""
    from nnperf.analysis import Analysis
    from nnperf.passes.comm_timeline import overlap
    from nnperf.prediction import predict_analysis
    from nnperf.search.memory_variants import checkpoint_blocks
    from nnperf.vocab import Category

    request = _request(SMALL_VOCAB, 3)
    name, build = resolve(request)
    traced = trace_rank(build, OPTIONS, ZERO1, checkpoint_blocks)
    by_index = {c.index: c for c in traced.collectives}
    prediction = predict_analysis(Analysis.from_trace(name, OPTIONS, traced.trace, traced.workload), GPU)
    comm = overlap(prediction.step, traced.trace, lambda i: (by_index[i].kind, by_index[i].bytes, 1e-3))
    updates = [t.index for t in prediction.step.ops
               if t.phase == "optimizer" and t.category != Category.COMMUNICATION and t.kernel_s > 0]
    broadcasts = [s for s in comm.slices if s.kind == "broadcast"]
    assert len(broadcasts) == len(list(build().model.parameters()))
    assert min(s.start_s for s in broadcasts) >= max(comm.clock[i] for i in updates) > 0


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
