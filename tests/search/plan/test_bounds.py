"""A search's pruned pipeline (its first stage alone does not fit) against the same layout
composed from all its stage roles: the bound is at most the layout's memory, and a layout that
fits is evaluated as without pruning."""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest
from torch_lowering import most_held

from nnperf.hardware.catalog import load_gpu
from nnperf.hardware.cluster import load_cluster
from nnperf.layout import Execution
from nnperf.request import ModelRequest
from nnperf.search.plan import Planned, evaluate
from nnperf.search.plan.bounds import same_work, work_bound
from nnperf.search.plan.rank import RoleCache, scaled_cost
from nnperf.search.plan.results import RankCost
from nnperf.trace.options import TraceOptions

LLAMA = {"dim": 128, "n_heads": 4, "ffn_hidden": 256, "vocab": 512, "n_layer": 16}
GPU, CLUSTER = load_gpu("h100"), load_cluster("dgx-h100")
OPTIONS = TraceOptions(amp="bf16")
REQUEST = ModelRequest("llama-7b", batch=1, seq_len=64, overrides=LLAMA)


@functools.cache
def _evaluated(execution: Execution, layers: int = 16) -> Planned:
    """``evaluate`` of a layout without pruning, from traces of its own, once per module: the
    tests compare several bounds against the same composed layouts (a search's figures do not
    depend on what was traced before, ``test_a_fitting_pipeline_is_not_pruned``)."""
    request = replace(REQUEST, overrides={**LLAMA, "n_layer": layers})
    return evaluate(request, OPTIONS, execution, GPU, CLUSTER, layers=layers, cache=RoleCache())


def _pipeline(schedule: str, virtual: int) -> Execution:
    return Execution(world=8, data="fsdp", shard=2, pipeline=4, pipeline_schedule=schedule, virtual_stages=virtual,
                     micro_batch=1, grad_accum=4, reshard_after_forward=False)


@pytest.mark.parametrize(("schedule", "virtual"), [("1f1b", 1), ("interleaved-1f1b", 2)])
def test_a_pruned_pipeline_is_a_lower_bound_from_one_role(schedule, virtual):
    execution = _pipeline(schedule, virtual)
    whole = RoleCache()
    exact = evaluate(REQUEST, OPTIONS, execution, GPU, CLUSTER, layers=16, cache=whole)  # counts its traces
    small = load_gpu("h100", overrides={"memory_gib": str(exact.memory_bytes / 2**30 / 4)})
    first = RoleCache()
    pruned = evaluate(REQUEST, OPTIONS, execution, small, CLUSTER, layers=16, cache=first, prune=True)
    assert pruned.memory_bound and not pruned.fits and pruned.step_s == 0.0
    assert small.memory_bytes < pruned.memory_bytes <= exact.memory_bytes
    assert (first.traces, whole.traces) == (1, 3)  # the first stage's role only, of first/middle/last
    if virtual == 1:  # one chunk per rank: rank 0's memory, here the largest
        assert pruned.memory_bytes == exact.memory_bytes


def test_a_fitting_pipeline_is_not_pruned():
    execution = _pipeline("interleaved-1f1b", 2)
    plain = _evaluated(execution)
    searched = evaluate(REQUEST, OPTIONS, execution, GPU, CLUSTER, layers=16, cache=RoleCache(), prune=True)
    assert plain.fits and not searched.memory_bound
    assert searched.to_json() == plain.to_json()


@pytest.mark.parametrize("data", ["fsdp", "zero1"])
def test_a_pipeline_is_pruned_once_its_traced_roles_alone_cannot_fit(data):
    """Interleaved over 4 ranks, rank 0 holds a first and a middle chunk: on a GPU between its
    first chunk's bound and the composed layout's memory, the first role alone fits and the
    middle one's trace shows rank 0 cannot; the last role is left untraced, and the bound is
    at most the memory composed from every role."""
    from nnperf.hardware.catalog import DRIVER_RESERVE
    from nnperf.passes.memory.capacity import capacity

    def gpu_holding(nbytes: float):
        return load_gpu("h100", overrides={"memory_gib": repr(nbytes / (1 - DRIVER_RESERVE) / 2**30)})

    execution = replace(_pipeline("interleaved-1f1b", 2), data=data, shard=2 if data == "fsdp" else 1, grad_accum=8)
    exact = _evaluated(execution)
    first = evaluate(REQUEST, OPTIONS, execution, gpu_holding(2**20), CLUSTER, layers=16, cache=RoleCache(),
                     prune=True)
    assert first.memory_bound == "its first pipeline stage alone" and first.memory_bytes < exact.memory_bytes
    between = gpu_holding((first.memory_bytes + exact.memory_bytes) / 2)
    cache = RoleCache()
    pruned = evaluate(REQUEST, OPTIONS, execution, between, CLUSTER, layers=16, cache=cache, prune=True)
    assert not pruned.fits and pruned.memory_bound == "its first and middle pipeline stages alone"
    assert capacity(between) < pruned.memory_bytes <= exact.memory_bytes
    assert cache.traces == 2  # the first and the middle role, not the last


def _first_role(execution: Execution, layers: int) -> RankCost:
    """The first stage's role as ``pipeline_step`` traces it: one micro-batch of GPipe over
    three stages, its blocks extrapolated to the layout's blocks per chunk."""
    stride = execution.world // execution.pipeline
    traced = replace(execution, world=3 * stride, pipeline=3, pipeline_schedule="gpipe", virtual_stages=1,
                     grad_accum=1)
    per_chunk = layers // (execution.pipeline * execution.virtual_stages)
    return scaled_cost(REQUEST, OPTIONS, traced, GPU, CLUSTER, 0, layers, RoleCache(), per_chunk=per_chunk)


@pytest.mark.parametrize(("schedule", "virtual"), [("1f1b", 1), ("interleaved-1f1b", 2), ("gpipe", 1)])
def test_a_pipeline_slower_than_the_best_is_cut_at_a_lower_bound_of_its_step(schedule, virtual):
    """40 blocks on 4 stages (10 or 5 per chunk, extrapolated from 3 and 4): the bound replays
    the schedule from the first stage's role alone, so it holds rank 0's own work (its first
    stage's forward and backward of each of the 4 micro-batches, its head and tail, worked out
    here) and more: the fill and drain that the other stages' blocks take; it is at most the
    step of the layout composed from all its roles. A search whose best so far is faster than
    the bound traces the first stage's role only."""
    layers = 40
    execution = _pipeline(schedule, virtual)
    request = replace(REQUEST, overrides={**LLAMA, "n_layer": layers})
    exact = _evaluated(execution, layers)
    first = RoleCache()
    cut = evaluate(request, OPTIONS, execution, GPU, CLUSTER, layers=layers, cache=first, prune=True,
                   slower_than=1e-9)
    role = _first_role(execution, layers)
    f = role.figures
    own = f.head_s + 4 * (f.action("F", 0) + f.action("B", 0)) + f.tail_s
    assert cut.time_bound and first.traces == 2  # the first role at 3 and 4 blocks
    assert own < cut.step_s <= exact.step_s
    if virtual == 1:
        # rank 0 runs micro-batch 0's forward, waits for the 3 other stages' forward and
        # backward of it (10 blocks each at the first stage's per-block time), then runs the
        # 4 backwards: its warm-up forwards hide in that wait, the chain does not
        chain = 3 * 10 * (role.per_block.action("F", 0) + role.per_block.action("B", 0))
        fill = f.head_s + f.action("F", 0) + chain + 4 * f.action("B", 0) + f.tail_s
        assert cut.step_s >= fill * (1 - 1e-9) and fill > own
    assert cut.memory_bound and cut.memory_bytes <= exact.memory_bytes
    kept = evaluate(request, OPTIONS, execution, GPU, CLUSTER, layers=layers, cache=RoleCache(), prune=True,
                    slower_than=exact.step_s * 2)
    assert not kept.time_bound and kept.to_json() == exact.to_json()


@pytest.mark.parametrize(("schedule", "virtual", "checkpoint"),
                         [("1f1b", 1, None), ("interleaved-1f1b", 2, None), ("1f1b", 1, "full")])
def test_a_pipeline_is_no_faster_than_its_gpus_average_compute(schedule, virtual, checkpoint):
    """Over the same 8 GPUs, a 4-stage pipeline (FSDP over 2) does per GPU the kernels FSDP over
    8 does at the same micro-batch and checkpointing: its composed step is at least that
    layout's compute (less what overlapping collectives slowed), so a search whose best is
    faster than that leaves the pipeline untraced."""
    execution = replace(_pipeline(schedule, virtual), checkpoint=checkpoint)
    flat = Execution(world=8, data="fsdp", shard=8, micro_batch=1, grad_accum=1, checkpoint=checkpoint)
    exact = _evaluated(execution)
    same = _evaluated(flat)
    work = same_work([same])
    compute = same.split.compute_s - same.split.overlap_slowdown_s
    assert 0 < compute <= exact.step_s
    cut = work_bound(execution, work, slower_than=compute)
    assert cut is not None and cut.step_s == compute and cut.time_bound
    assert work_bound(execution, work, slower_than=compute * 1.01) is None  # the best so far is faster
    assert work_bound(replace(execution, micro_batch=2, grad_accum=2), work, slower_than=0.0) is None  # other work


@pytest.mark.parametrize(("schedule", "virtual"), [("1f1b", 1), ("interleaved-1f1b", 2)])
def test_a_pipelines_memory_is_at_least_its_blocks_state_and_in_flight_activations(schedule, virtual):
    """40 blocks on 4 stages: rank 0 holds the parameters and optimizer state of its blocks (per
    GPU the bytes of all 40 blocks under FSDP over 8, as 1/4 of them sharded over 2), the
    saved activations of the blocks its schedule keeps in flight (1F1B: 4 micro-batches of its
    10 blocks, worked out here), each block's bytes as FSDP over 8 at the same micro-batch
    traces them (less one row of each parameter per GPU: FSDP2's padding), and, not resharding
    after forward, its first chunk's gathered parameters when its first backward starts (10
    blocks, or 5 of 2 chunks; in bf16 under --amp bf16: half the fp32 shards' bytes), or, at
    the end of that chunk's backward, its states, that copy and the chunk's whole fp32 gradient
    (torch's stage reduce-scatters it after); the composed layout holds at least each, and a
    GPU smaller than the larger is rejected untraced."""
    from nnperf.search.plan.pipeline import blocks_in_flight

    layers = 40
    execution = _pipeline(schedule, virtual)
    request = replace(REQUEST, overrides={**LLAMA, "n_layer": layers})
    flat = Execution(world=8, data="fsdp", shard=8, micro_batch=1, grad_accum=1)
    same = _evaluated(flat, layers)
    block = same.per_block
    in_flight = blocks_in_flight(execution, layers)
    if virtual == 1:
        assert in_flight == 4 * 10
    params = block.states.parameters - block.param_row_bytes
    assert block.saved_activations > 0 and params > 0 and block.param_row_bytes > 0
    held = layers * params * (1 + block.states.optimizer_state / block.states.parameters) \
        + in_flight * block.saved_activations
    gathered = (10 if virtual == 1 else 5) * params * 8 / 2
    exact = _evaluated(execution, layers)
    assert held + gathered <= exact.memory_bytes
    cut = work_bound(execution, same_work([same]), None, capacity_bytes=held * 0.99, layers=layers)
    assert cut is not None and not cut.fits and cut.memory_bytes == int(held) and cut.memory_bound
    assert work_bound(execution, same_work([same]), None, capacity_bytes=held * 1.01, layers=layers) is None
    cut = work_bound(execution, same_work([same]), None, capacity_bytes=(held + gathered) * 0.99, layers=layers,
                     options=OPTIONS)
    assert cut is not None and cut.memory_bytes == int(held + gathered) and "gathered" in cut.memory_bound
    assert work_bound(execution, same_work([same]), None, capacity_bytes=(held + gathered) * 1.01, layers=layers,
                      options=OPTIONS) is None
    # at another micro-batch and checkpointing no FSDP layout does the same work: one of the same
    # tensor split bounds the states alone (the same per block at any micro-batch)
    other = replace(execution, micro_batch=2, checkpoint="full")
    states = held - in_flight * block.saved_activations + gathered
    assert states <= _evaluated(other, layers).memory_bytes
    cut = work_bound(other, same_work([same]), None, capacity_bytes=states * 0.99, layers=layers, options=OPTIONS)
    assert cut is not None and "in-flight" not in cut.memory_bound
    # at the end of its first chunk's backward, torch's stage has not yet reduce-scattered the
    # chunk's gradient: whole in fp32 (the reduce dtype under --amp bf16), twice its bf16
    # gathered copy, beside that copy, the activations freed
    ending = states + 2 * gathered
    assert ending <= _evaluated(other, layers).memory_bytes and ending <= exact.memory_bytes
    assert cut.memory_bytes == int(ending) and "accumulated gradient" in cut.memory_bound
    assert work_bound(other, same_work([same]), None, capacity_bytes=ending * 1.01, layers=layers,
                      options=OPTIONS) is None
    # DDP's blocks save more (autocast's casts of its whole weights): no bound from it
    ddp = evaluate(request, OPTIONS, replace(flat, data="ddp", shard=1), GPU, CLUSTER, layers=layers, cache=RoleCache())
    assert ddp.per_block.saved_activations > block.saved_activations
    assert work_bound(execution, same_work([ddp]), None, capacity_bytes=0.0, layers=layers) is None


@pytest.mark.parametrize("reshard", [False, True])
def test_a_pipelines_bound_at_the_end_of_its_backward_stays_below_its_composed_memory(reshard):
    """A 2048-wide Llama of 40 blocks on 4 stages, full checkpointing: its parameters dominate,
    so the bound at the end of the first chunk's backward (its states, the chunk's gathered copy
    and its whole fp32 gradient, worked out here from the FSDP layout's per-block bytes) is most
    of the composed memory, and must stay below it less the CUDA context, which the bound leaves
    out; the gathered copy is alive there whether or not the layout reshards after forward."""
    wide = {"dim": 2048, "n_heads": 16, "ffn_hidden": 8192, "vocab": 512, "n_layer": 40}
    request = replace(REQUEST, overrides=wide)
    execution = Execution(world=8, data="fsdp", shard=2, pipeline=4, pipeline_schedule="1f1b", micro_batch=2,
                          grad_accum=4, reshard_after_forward=reshard, checkpoint="full")
    cache = RoleCache()
    flat = evaluate(request, OPTIONS, Execution(world=8, data="fsdp", shard=8, micro_batch=1, grad_accum=1), GPU,
                    CLUSTER, layers=40, cache=cache)
    bound = work_bound(execution, same_work([flat]), None, capacity_bytes=0.0, layers=40, options=OPTIONS)
    composed = evaluate(request, OPTIONS, execution, GPU, CLUSTER, layers=40, cache=cache)
    block = flat.per_block
    params = block.states.parameters - block.param_row_bytes
    optimizer = block.states.optimizer_state * params / block.states.parameters
    chunk = 10 * params * 8  # the first chunk's 10 blocks, whole, fp32
    expected = 10 * (params + optimizer) * 8 / 2 + chunk * 0.5 + chunk  # bf16 copy, fp32 gradient
    assert bound is not None and "accumulated gradient" in bound.memory_bound
    assert bound.memory_bytes == pytest.approx(expected, abs=2)
    assert 0.5 * (composed.memory_bytes - composed.context_bytes) < bound.memory_bytes
    assert bound.memory_bytes <= composed.memory_bytes - composed.context_bytes


def test_a_many_chunk_pipelines_bound_stays_below_its_composed_memory():
    """8 chunks per rank (a 4096-wide Llama of 64 blocks, 4 stages, FSDP over 64): rank 0's first
    chunk's gathered copies, as its traced role holds them, and its later chunks' gathered blocks
    and accumulated gradients where torch's lowering of the schedule holds them
    (``torch_lowering``: with one round of micro-batches, 4, only the two stages it prefetches are
    gathered; with two, 8, the chunks take turns and hold their gradients too). The bound is that
    sum, worked out here, and stays below the composed memory (a bound counting every chunk's
    gathered copies was 1.13x this layout's composed memory and rejected layouts that fit)."""
    from nnperf.search.plan.pipeline import blocks_in_flight

    wide = {"dim": 4096, "n_heads": 32, "ffn_hidden": 11008, "vocab": 512, "n_layer": 64}
    request = replace(REQUEST, overrides=wide)
    execution = Execution(world=256, data="fsdp", shard=64, pipeline=4, pipeline_schedule="interleaved-1f1b",
                          virtual_stages=8, micro_batch=1, grad_accum=4, reshard_after_forward=False)
    flat = Execution(world=256, data="fsdp", shard=256, micro_batch=1, grad_accum=1)
    cache = RoleCache()
    same = evaluate(request, OPTIONS, flat, GPU, CLUSTER, layers=64, cache=cache)
    bounds = {}
    for micro_batches in (4, 8):
        layout = replace(execution, grad_accum=micro_batches)
        bound = work_bound(layout, same_work([same]), None, capacity_bytes=0.0, layers=64, options=OPTIONS)
        assert bound is not None and "gathered" in bound.memory_bound
        assert bound.memory_bytes <= evaluate(request, OPTIONS, layout, GPU, CLUSTER, layers=64,
                                              cache=cache).memory_bytes
        bounds[micro_batches] = bound
    # by hand: rank 0's 16 blocks' parameters and optimizer state over its 64 shards, its
    # in-flight activations, its first chunk's 2 blocks gathered (bf16: half the fp32 shards over
    # the group), and its later chunks' copies as torch's lowering holds them (2 blocks each)
    block = same.per_block
    params = block.states.parameters - block.param_row_bytes
    optimizer = block.states.optimizer_state * params / block.states.parameters
    chunk = 2 * params * 256  # a chunk's blocks, whole (fp32)
    for micro_batches, bound in bounds.items():
        layout = replace(execution, grad_accum=micro_batches)
        expected = (16 * (params + optimizer) * 256 / 64 + blocks_in_flight(layout, 64) * block.saved_activations
                    + chunk * 0.5 + most_held(4, 8, micro_batches, 0, chunk * 0.5, chunk))
        assert bound.memory_bytes == pytest.approx(expected, abs=2)
        assert "later chunks" in bound.memory_bound
