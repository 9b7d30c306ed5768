"""The plan's shortcuts against direct traces: a deep stack extrapolated from 3 and 4 blocks
against the stack traced whole, and a pipeline composed from its traced stage roles against
the real schedule traced on every distinct rank."""

from __future__ import annotations

from dataclasses import replace

import pytest

from nnperf.hardware.catalog import load_gpu
from nnperf.hardware.cluster import load_cluster
from nnperf.hardware.host import DEFAULT_HOST
from nnperf.hardware.profile import default_profile
from nnperf.layout import Execution
from nnperf.request import ModelRequest
from nnperf.search.plan import evaluate
from nnperf.search.plan.pipeline import traced_schedule_step
from nnperf.search.plan.rank import (
    RoleCache,
    collective_estimator,
    collective_timer,
    dense_blocks_of,
    extrapolate,
    megatron_sequence_parallel_grads,
    rank_cost,
    rank_profile,
    scaled_cost,
    shallow_overrides,
)
from nnperf.search.plan.results import RankCost, RankFigures, collective_totals
from nnperf.trace.options import TraceOptions

LLAMA = {"dim": 128, "n_heads": 4, "ffn_hidden": 256, "vocab": 512}
GPU, CLUSTER = load_gpu("h100"), load_cluster("dgx-h100")
OPTIONS = TraceOptions(amp="bf16")


@pytest.mark.parametrize("execution", [
    Execution(world=4, data="fsdp", shard=4, micro_batch=2),
    Execution(world=4, data="fsdp", shard=2, tensor=2, sequence_parallel=True, micro_batch=2),
], ids=["fsdp", "fsdp-tp-sp"])
def test_a_deep_stack_from_two_shallow_traces(execution):
    """Depth 7 from depths 3 and 4: what adds up per block (state bytes, collectives, FLOPs) is
    exact; the step's time and memory agree within 1%."""
    request = ModelRequest("llama-7b", batch=2, seq_len=64, overrides={**LLAMA, "n_layer": 7})
    scaled = scaled_cost(request, OPTIONS, execution, GPU, CLUSTER, 0, layers=7)
    direct = rank_cost(request, OPTIONS, execution, GPU, CLUSTER)
    assert scaled.figures.states.to_json() == direct.figures.states.to_json()
    assert collective_totals(scaled.figures) == collective_totals(direct.figures)
    assert scaled.figures.flops == pytest.approx(direct.figures.flops, rel=1e-9)
    assert scaled.figures.step_s == pytest.approx(direct.figures.step_s, rel=0.01)
    assert scaled.figures.memory == pytest.approx(direct.figures.memory, rel=0.01)


def test_megatron_reduces_the_norms_gradients_as_one_all_reduce():
    """Megatron-LM with sequence parallelism: the norms' weight and bias gradients, reduced one
    by one over the tensor-parallel group by the traced DTensor, are one flattened all-reduce
    (finalize_model_grads), timed once with all their bytes."""
    from nnperf.kernels.collectives import estimate_collective
    from nnperf.loading import resolve
    from nnperf.trace.blocks import repeated_blocks
    from nnperf.trace.distributed import trace_rank

    request = ModelRequest("llama-7b", batch=1, seq_len=64,
                           overrides={**LLAMA, "n_layer": 2, "norm": "layernorm", "n_kv_heads": 4})
    megatron = Execution(world=4, data="zero1", tensor=2, sequence_parallel=True, micro_batch=1)
    _, build = resolve(request)
    traced = trace_rank(build, OPTIONS, megatron, repeated_blocks, None, rank=0)
    by_index = {c.index: c for c in traced.collectives}
    coalesced = megatron_sequence_parallel_grads(megatron, traced.trace.config, by_index)
    norms = 2 * 2 + 1  # two a block and the final one
    assert len(coalesced) == 2 * norms  # weight and bias of each LayerNorm
    assert {by_index[i].module.split(".")[-1] for i in coalesced} == {"attention_norm", "ffn_norm", "norm"}
    timed = collective_timer(collective_estimator(CLUSTER, megatron, {}), by_index, False, coalesced)
    first = by_index[min(coalesced)]
    together = sum(by_index[i].bytes for i in coalesced)
    assert together == 2 * norms * LLAMA["dim"] * 4  # fp32 (AMP) weight and bias of dim elements each
    assert sum(timed(i)[2] for i in coalesced) == pytest.approx(
        estimate_collective("all_reduce", together, first.group_ranks, CLUSTER).time_s)
    torchtitan = replace(megatron, data="fsdp", shard=2)  # DTensor's own layout: one by one
    assert not megatron_sequence_parallel_grads(torchtitan, traced.trace.config, by_index)


def test_megatron_tensor_parallelism_pays_no_dtensor_dispatch():
    """Megatron-Core's parallel linear layers are plain tensors calling their own collectives:
    a layout only Megatron-LM runs (ZeRO-1 beside tensor parallelism) is priced without the
    DTensor dispatch that torchtitan's tensor parallelism pays on every op of its DTensors."""
    megatron = Execution(world=4, data="zero1", tensor=2, micro_batch=2)
    torchtitan = Execution(world=2, tensor=2, micro_batch=2)
    default = default_profile(GPU)
    assert default.host_dtensor_dispatch_s > 0 and default.host_dtensor_list_tensor_s > 0
    assert rank_profile(torchtitan, GPU, DEFAULT_HOST) == default
    priced = rank_profile(megatron, GPU, DEFAULT_HOST)
    assert priced.host_dtensor_dispatch_s == priced.host_dtensor_list_tensor_s == 0
    assert priced.host_dispatch_s == default.host_dispatch_s  # plain ops cost what they cost
    request = ModelRequest("llama-7b", batch=2, seq_len=64, overrides={**LLAMA, "n_layer": 2})
    dtensor_ops = rank_cost(request, OPTIONS, torchtitan, GPU, CLUSTER).figures.host_s
    plain_ops = rank_cost(request, OPTIONS, megatron, GPU, CLUSTER).figures.host_s
    assert plain_ops < dtensor_ops


def test_a_rank_is_priced_with_its_clusters_host():
    """The host costs of a DGX H100 rank: the defaults' (a 2.44 GHz cloud-VM core) times
    2.44 / 3.8, the Xeon Platinum 8480C's turbo clock (Intel ARK)."""
    execution = Execution(world=2, tensor=2, micro_batch=2)
    default, dgx = default_profile(GPU), rank_profile(execution, GPU, CLUSTER.host)
    for field in ("host_dispatch_s", "host_view_s", "host_backward_node_s", "host_dtensor_dispatch_s"):
        assert getattr(dgx, field) == pytest.approx(getattr(default, field) * 2.44 / 3.8), field
    assert dgx.kernel_overhead_s == default.kernel_overhead_s and dgx.host == "xeon-8480c"


@pytest.mark.parametrize(("schedule", "virtual"), [("1f1b", 1), ("interleaved-1f1b", 2)])
def test_a_pipeline_from_its_stage_roles(schedule, virtual):
    """4 stages x 8 micro-batches: composed from one traced micro-batch per stage role against
    the real schedule traced on the first, a middle and the last rank (4 micro-batches, the
    in-flight peak of 8): step within 5%, memory within 10%."""
    execution = Execution(world=4, pipeline=4, pipeline_schedule=schedule, virtual_stages=virtual,
                          micro_batch=1, grad_accum=8)
    request = ModelRequest("llama-7b", batch=8, seq_len=64, overrides={**LLAMA, "n_layer": 8})
    composed = evaluate(request, OPTIONS, execution, GPU, CLUSTER, layers=8, cache=RoleCache())
    traced = traced_schedule_step(request, OPTIONS, execution, GPU, CLUSTER, 8, RoleCache(), None)
    assert composed.step_s == pytest.approx(traced.step_s, rel=0.05)
    assert composed.memory_bytes == pytest.approx(traced.memory_bytes, rel=0.10)
    assert composed.pipeline.in_flight == traced.pipeline.in_flight


def test_any_stage_roles_are_three_stage_roles():
    """Every pipeline is traced as stages of a three-stage one (so that a two-rank pipeline's
    1F1B and interleaved layouts share their roles, and a deep pipeline's traced model holds
    three chunks, not one per stage): a stage's trace is its own chunk, its neighbours' ranks
    and its data-parallel group, so the first, a middle and the last role of two, three and
    five stages give the same numbers (the last role's action labels name its stage)."""
    costs = {}
    for stages in (2, 3, 5):
        execution = Execution(world=2 * stages, data="fsdp", shard=2, pipeline=stages, pipeline_schedule="gpipe",
                              micro_batch=2, reshard_after_forward=False)
        request = ModelRequest("llama-7b", batch=2, seq_len=64, overrides={**LLAMA, "n_layer": 4 * stages})
        roles = (("first", 0), ("last", stages - 1)) + ((("middle", 1),) if stages > 2 else ())
        for role, stage in roles:
            cost = rank_cost(request, OPTIONS, execution, GPU, CLUSTER, 2 * stage)
            own = "@last" if role == "last" else f"@{stage}"
            costs[stages, role] = replace(cost.figures, action_s={k.replace(f"@{stage}", own): v
                                                                 for k, v in cost.figures.action_s.items()})
    assert costs[2, "first"] == costs[3, "first"] == costs[5, "first"]
    assert costs[2, "last"] == costs[3, "last"] == costs[5, "last"]
    assert costs[3, "middle"] == costs[5, "middle"]
    one_chunk = Execution(world=4, data="fsdp", shard=2, pipeline=2, pipeline_schedule="1f1b", micro_batch=1,
                          grad_accum=2, reshard_after_forward=False)
    two_chunks = replace(one_chunk, pipeline_schedule="interleaved-1f1b", virtual_stages=2)
    request = ModelRequest("llama-7b", batch=2, seq_len=64, overrides={**LLAMA, "n_layer": 40})
    cache = RoleCache()
    for execution in (one_chunk, two_chunks):
        evaluate(request, OPTIONS, execution, GPU, CLUSTER, layers=40, cache=cache)
    assert cache.traces == 6  # first and last at 3 and 4 blocks, then the middle role's two only


@pytest.mark.parametrize("reshard", [False, True], ids=["keep-gathered", "reshard-after-forward"])
def test_fsdp_gathered_parameters_are_not_per_micro_batch(reshard):
    """FSDP2's gathered (unsharded) parameters of a pipeline stage are held once, whatever the
    micro-batches in flight (the root module's after forward always, every block's with
    reshard-after-forward off), so the composed memory must not multiply them like the
    activations a micro-batch saves (issue 18: a 70B stage counted its gathered blocks and
    embedding once per in-flight micro-batch). 4 stages x 8 micro-batches under FSDP over 2 ranks
    with full checkpointing, against the real 1F1B schedule traced on the first, a middle and
    the last rank: memory within 10% (before the fix, keeping the blocks gathered composed
    1216 MB against the schedule's 1080 MB)."""
    from nnperf.search.plan import prepare_for

    execution = Execution(world=8, data="fsdp", shard=2, pipeline=4, pipeline_schedule="1f1b", micro_batch=1,
                          grad_accum=8, checkpoint="full", reshard_after_forward=reshard)
    wide = {**LLAMA, "dim": 1024, "n_heads": 8, "ffn_hidden": 2816, "n_layer": 8}  # parameters >> activations
    request = ModelRequest("llama-7b", batch=8, seq_len=64, overrides=wide)
    composed = evaluate(request, OPTIONS, execution, GPU, CLUSTER, layers=8, cache=RoleCache())
    traced = traced_schedule_step(request, OPTIONS, execution, GPU, CLUSTER, 8, RoleCache(), prepare_for(execution))
    assert composed.pipeline.in_flight == traced.pipeline.in_flight
    assert composed.memory_bytes == pytest.approx(traced.memory_bytes, rel=0.10)


def test_fsdp_chunks_taking_turns_hold_their_gathered_parameters_and_gradients():
    """Under FSDP2 a pipeline stage's backwards neither reshard nor reduce until its last
    micro-batch (``PipelineStage.backward_maybe_with_nosync``, then ``REDUCE_GRAD``): with 8
    micro-batches on 4 ranks of 2 chunks, rank 0's chunks take turns at their backwards, so
    while one peaks the other holds its gathered blocks and its fp32 accumulated gradient. The
    real interleaved schedule traced over all 8 micro-batches on rank 0 against the composed
    pipeline: within 5% (composed without those copies: 1268 MB against the schedule's 1393 MB,
    9% short). With 4 micro-batches (one round: each chunk's backwards end before the other's
    begin) neither holds the other's, and the composition adds nothing."""
    from nnperf.search.plan import prepare_for

    execution = Execution(world=8, data="fsdp", shard=2, pipeline=4, pipeline_schedule="interleaved-1f1b",
                          virtual_stages=2, micro_batch=1, grad_accum=8, checkpoint="full",
                          reshard_after_forward=False)
    wide = {**LLAMA, "dim": 1024, "n_heads": 8, "ffn_hidden": 2816, "n_layer": 16}  # parameters >> activations
    request = ModelRequest("llama-7b", batch=8, seq_len=64, overrides=wide)
    for micro_batches in (8, 4):
        layout = replace(execution, grad_accum=micro_batches)
        batch = replace(request, batch=micro_batches)
        composed = evaluate(batch, OPTIONS, layout, GPU, CLUSTER, layers=16, cache=RoleCache())
        rank0 = scaled_cost(batch, OPTIONS, layout, GPU, CLUSTER, 0, 16, RoleCache(), prepare_for(layout))
        assert composed.memory_bytes == pytest.approx(rank0.figures.memory, rel=0.05), micro_batches


def test_an_extrapolated_step_is_never_shorter_than_its_host_or_device_time():
    """At 3 and 4 blocks the device sets the step (10 and 12 ms) while the host, slower per
    block, catches up (9 and 12 ms): at 12 blocks the lines give a step of 28 ms and a host of
    36 ms, and the step is the host's."""
    low = RankCost(RankFigures(step_s=10e-3, host_s=9e-3, compute_s=8e-3))
    high = RankCost(RankFigures(step_s=12e-3, host_s=12e-3, compute_s=9e-3))
    deep = extrapolate(low, high, 3, 4, 12).figures
    assert deep.host_s == pytest.approx(36e-3)
    assert deep.step_s == pytest.approx(36e-3)
    assert deep.compute_s == pytest.approx(17e-3)


def test_an_extrapolated_wait_stops_at_zero_and_the_step_keeps_what_it_lost():
    """Each trace's step is its compute plus its all-gather waits: at 3 blocks 8 ms + 3 (2 of
    them the once-per-step gather's, 1 every micro-batch's), at 4 blocks 9.5 + 3.5 (1 and
    2.5). At 12 blocks the gather's line reads 2 - 9 = -7 ms: it stops at 0, the micro-batch's
    part grows to 1 + 9 x 1.5 = 14.5, and the step is 21.5 ms of compute plus 14.5 of waits
    (its own line, 11 + 9 x 2 = 29, had lost the 7)."""
    low = RankCost(RankFigures(step_s=11e-3, compute_s=8e-3, exposed_s={"all_gather": 3e-3},
                               sync_exposed_s={"all_gather": 2e-3}))
    high = RankCost(RankFigures(step_s=13e-3, compute_s=9.5e-3, exposed_s={"all_gather": 3.5e-3},
                                sync_exposed_s={"all_gather": 1e-3}))
    deep = extrapolate(low, high, 3, 4, 12).figures
    assert deep.sync_exposed_s["all_gather"] == 0.0 and deep.sync_s == 0.0
    assert deep.exposed_s["all_gather"] == pytest.approx(14.5e-3)
    assert deep.compute_s == pytest.approx(21.5e-3)
    assert deep.step_s == pytest.approx(36e-3)
    # a step of 4 micro-batches: the waits of every micro-batch 4 times, the gather's none
    assert deep.exposed_over(4)["all_gather"] == pytest.approx(4 * 14.5e-3)


def test_a_deep_zero1_rank_over_nodes_from_two_shallow_traces():
    """A ZeRO-1 rank of 64 data-parallel ranks over eight nodes waits at its first forward for
    the gather of its first buckets (0.51 ms at 3 blocks, 0.43 at 4); deeper stacks hide all
    of it, where the line through the two would go below zero. The step at 12 blocks, its
    once-per-step part and every micro-batch's part, from 3 and 4 blocks, agree with the
    stack traced whole within 1%."""
    execution = Execution(world=64, data="zero1", micro_batch=1)
    options = TraceOptions(dtype="bf16", pointwise="fused", sdpa="cudnn")
    wide = {"dim": 2048, "n_heads": 16, "ffn_hidden": 8192, "vocab": 32000}
    request = ModelRequest("llama-7b", batch=1, seq_len=4096, overrides={**wide, "n_layer": 12})
    shallow = rank_cost(replace(request, overrides={**wide, "n_layer": 3}), options, execution, GPU, CLUSTER)
    assert shallow.figures.sync_exposed_s["all_gather"] > 0  # the case: a gather waited for
    scaled = scaled_cost(request, options, execution, GPU, CLUSTER, 0, layers=12).figures
    direct = rank_cost(request, options, execution, GPU, CLUSTER).figures
    assert all(v >= 0 for v in (*scaled.exposed_s.values(), *scaled.sync_exposed_s.values()))
    assert scaled.step_s == pytest.approx(direct.step_s, rel=0.01)
    assert scaled.sync_s == pytest.approx(direct.sync_s, rel=0.01)
    once = scaled.once_span_s + scaled.sync_s
    assert scaled.step_s - once == pytest.approx(direct.step_s - direct.once_span_s - direct.sync_s, rel=0.01)


def test_a_cache_started_from_known_roles_traces_only_the_others():
    made = RoleCache()
    first = made.get("a", lambda: "traced a")
    worker = RoleCache(made.known)  # a later pass's task
    assert worker.get("a", lambda: pytest.fail("traced again")) == first
    assert worker.get("b", lambda: "traced b") == "traced b"
    assert worker.made == {"b": "traced b"} and worker.traces == 1
    made.adopt(worker.made)
    assert made.known == {"a": "traced a", "b": "traced b"} and made.traces == 2


def test_a_shallow_trace_keeps_the_leading_dense_blocks_in_its_first_chunk():
    """DeepSeek-V3's 3 dense blocks (its config.json's first_k_dense_replace), read off the
    model by name or as set: a trace of 3 chunks of 2 blocks keeps 2 of them, of 4 blocks all 3;
    other models' options are left as they are."""
    assert dense_blocks_of(ModelRequest("deepseek-v3")) == 3
    assert dense_blocks_of(ModelRequest("deepseek-v3-16b")) == 1  # torchtitan's 16B flavor
    assert dense_blocks_of(ModelRequest("deepseek-v3-16b", overrides={"n_dense_layers": 3})) == 3
    assert dense_blocks_of(ModelRequest("llama3-8b")) == dense_blocks_of(ModelRequest("gpt2")) == 0
    assert shallow_overrides({"dim": 64}, 2, 3, dense=3) == {"dim": 64, "n_layer": 6, "n_dense_layers": 2}
    assert shallow_overrides({"dim": 64}, 4, 3, dense=3) == {"dim": 64, "n_layer": 12}


def test_torchs_stages_hold_every_micro_batchs_receive_buffers_all_step():
    """torch's ``PipelineStage`` allocates the buffers of every micro-batch's received activation
    and output gradient when its schedule first runs and keeps them all step: with 16
    micro-batches on 4 stages, a middle stage holds 16 pairs while 3 micro-batches are in flight.
    Composed against the real 1F1B schedule traced over all 16 micro-batches on every rank:
    within 1.5% (counting the buffers per micro-batch in flight composed 11% short)."""
    from nnperf.search.plan import prepare_for

    execution = Execution(world=4, pipeline=4, pipeline_schedule="1f1b", micro_batch=4, grad_accum=16,
                          checkpoint="full")
    request = ModelRequest("llama-7b", batch=64, seq_len=2048, overrides={**LLAMA, "n_layer": 8})
    composed = evaluate(request, OPTIONS, execution, GPU, CLUSTER, layers=8, cache=RoleCache())
    direct = max(scaled_cost(request, OPTIONS, execution, GPU, CLUSTER, rank, 8, RoleCache(),
                             prepare_for(execution)).figures.memory for rank in range(4))
    assert composed.memory_bytes == pytest.approx(direct, rel=0.015)
