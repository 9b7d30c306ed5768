"""Context parallelism's closed form on a traced rank (search.plan.context): the ring's
all-gathers carry the whole sequence's K and V per attention layer (sizes by hand), the rank's
attention does cp times the causal pairs of its chunk, and a sequence that does not split into
2 x cp chunks is one line."""

from __future__ import annotations

import pytest

from nnperf.errors import UsageError
from nnperf.hardware.catalog import load_gpu
from nnperf.hardware.cluster import load_cluster
from nnperf.layout import Execution
from nnperf.request import ModelRequest
from nnperf.search.plan import evaluate
from nnperf.search.plan.rank import RoleCache
from nnperf.trace.options import TraceOptions

GPU, CLUSTER = load_gpu("h100"), load_cluster("dgx-h100")
LAYERS, DIM, HEADS, KV, SEQ = 2, 128, 4, 2, 256
REQUEST = ModelRequest("llama-7b", batch=1, seq_len=SEQ, overrides={
    "n_layer": LAYERS, "dim": DIM, "n_heads": HEADS, "n_kv_heads": KV, "ffn_hidden": 256, "vocab": 512})


def test_ring_attention_collectives_by_hand():
    cp = 4
    planned = evaluate(REQUEST, TraceOptions(amp="bf16"), Execution(world=8, data="fsdp", shard=2, context=cp),
                       GPU, CLUSTER, cache=RoleCache())
    kv = 2 * SEQ * KV * (DIM // HEADS) * 2  # K and V of the whole sequence, bf16
    assert planned.collectives["context_all_gather"].to_json() == {"count": 2 * LAYERS, "bytes": 2 * LAYERS * kv}
    assert planned.collectives["context_reduce_scatter"].to_json() == {"count": LAYERS, "bytes": LAYERS * kv}
    # FSDP shards over the data and context ranks together (8 ranks), as torchtitan's dp_shard_cp
    plain = evaluate(REQUEST, TraceOptions(amp="bf16"), Execution(world=8, data="fsdp", shard=8), GPU, CLUSTER,
                     cache=RoleCache())
    assert planned.state_bytes == plain.state_bytes
    assert planned.split.exposed_communication_s["context_all_gather_reduce_scatter"] > 0


def test_a_sequence_that_does_not_split_is_one_line():
    with pytest.raises(UsageError, match="context parallel degree 3 does not split the 256-token sequence "
                                         "into 2 x 3 equal chunks; nearest valid degrees: 2 or 4"):
        evaluate(REQUEST, TraceOptions(amp="bf16"), Execution(world=6, data="fsdp", shard=2, context=3), GPU,
                 CLUSTER, cache=RoleCache())


def test_mfu_counts_the_same_model_flops_with_full_checkpointing():
    """MFU over throughput is the model's FLOPs per token over the peak: the same whatever the
    layout recomputes, its ring attention's extra chunks included."""
    def per_token(checkpoint):
        planned = evaluate(REQUEST, TraceOptions(amp="bf16"),
                           Execution(world=8, data="fsdp", shard=2, context=4, checkpoint=checkpoint),
                           GPU, CLUSTER, cache=RoleCache())
        return planned.mfu / planned.throughput

    assert per_token("full") == pytest.approx(per_token(None), rel=1e-6)


def test_full_checkpointing_reruns_the_rings_attention_too():
    """Recomputation under full checkpointing grows with the ring: the rank's attention runs cp
    times its traced chunk's, so what checkpointing reruns of it does too: cp - 1 times the
    traced role's recomputed attention more (the helper that tried Llama 3 405B at CP 16 found
    the same recomputation at 131k tokens as at 8k)."""
    from nnperf.search.plan.context import traced_as, with_ring_attention
    from nnperf.search.plan.evaluate import prepare_for
    from nnperf.search.plan.rank import scaled_cost

    cp = 4
    execution = Execution(world=8, data="fsdp", shard=2, context=cp, checkpoint="full")
    request = ModelRequest(REQUEST.target, batch=1, seq_len=SEQ // cp, overrides=REQUEST.overrides)
    base = scaled_cost(request, TraceOptions(amp="bf16"), traced_as(execution), GPU, CLUSTER, 0, None,
                       RoleCache(), prepare_for(execution))
    ring = with_ring_attention(base, execution, CLUSTER)
    forward_attention = base.figures.attention_forward_s
    assert forward_attention > 0
    # every block rerun whole: its attention once more, as long as in forward
    assert base.figures.attention_recomputed_s == pytest.approx(forward_attention)
    added = ring.figures.recompute_s - base.figures.recompute_s
    assert added == pytest.approx((cp - 1) * forward_attention)


def test_context_parallelism_in_a_pipeline():
    """2 stages x CP 2: each stage's role is traced on half the sequence and its actions take the
    ring attention's collectives (per attention layer of the stage: two all-gathers of the whole
    sequence's K and V and a reduce-scatter of their gradients, sizes by hand); against the
    pipeline of half sequences over the same GPUs (twice the data-parallel ranks), the same tokens
    a step, in a longer one (attention over the whole sequence, the ring's collectives)."""
    from dataclasses import replace

    execution = Execution(world=8, data="fsdp", shard=2, context=2, pipeline=2, pipeline_schedule="1f1b",
                          micro_batch=1, grad_accum=2, reshard_after_forward=False)
    planned = evaluate(REQUEST, TraceOptions(amp="bf16"), execution, GPU, CLUSTER, layers=LAYERS, cache=RoleCache())
    kv = 2 * SEQ * KV * (DIM // HEADS) * 2
    per_stage = LAYERS // 2
    assert planned.collectives["context_all_gather"].to_json() == {"count": 2 * per_stage, "bytes": 2 * per_stage * kv}
    half = evaluate(replace(REQUEST, seq_len=SEQ // 2), TraceOptions(amp="bf16"),
                    replace(execution, context=1, shard=4), GPU, CLUSTER, layers=LAYERS, cache=RoleCache())
    assert planned.step_s > half.step_s
    assert planned.throughput * planned.step_s == pytest.approx(half.throughput * half.step_s, rel=1e-9)


def test_a_context_rank_is_traced_in_its_engines_data_parallel_group():
    """A context-parallel rank is traced on its share of the sequence with the context ranks in
    its data-parallel group: torchtitan shards FSDP over them (``dp_shard_cp``), with DDP alone
    too; Megatron-LM keeps its DDP or ZeRO-1 over data x context ranks, also where one of its own
    settings marks the layout as Megatron-LM's without other data parallelism."""
    from nnperf.search.plan.context import traced_as

    torchtitan = traced_as(Execution(world=8, tensor=2, sequence_parallel=True, context=4))
    assert (torchtitan.data, torchtitan.shard, torchtitan.context, torchtitan.data_parallel) == ("fsdp", 4, 1, 4)
    zero1 = traced_as(Execution(world=16, data="zero1", tensor=2, sequence_parallel=True, context=4))
    assert (zero1.data, zero1.shard, zero1.context, zero1.data_parallel) == ("zero1", 1, 1, 8)
    for own in ({"checkpoint": "selective-attention"}, {"tp_comm_overlap": True}):
        megatron = traced_as(Execution(world=8, tensor=2, sequence_parallel=True, context=4, **own))
        assert (megatron.data, megatron.shard, megatron.data_parallel) == ("ddp", 1, 4)


def test_the_optimizer_runs_once_in_an_accumulated_steps_split():
    """Context parallelism with 2 and 4 micro-batches of the same traced rank: the host and the
    compute of the split grow by the micro-batches' share only, so twice the 2's less the 4's is
    what runs once (the optimizer's kernels and issue), more than nothing (both were counted once
    per micro-batch before)."""
    splits = {}
    for accum in (2, 4):
        execution = Execution(world=4, data="ddp", context=2, micro_batch=1, grad_accum=accum)
        splits[accum] = evaluate(REQUEST, TraceOptions(amp="bf16"), execution, GPU, CLUSTER, layers=LAYERS,
                                 cache=RoleCache()).split
    assert 2 * splits[2].host_s - splits[4].host_s > 0
    assert 2 * splits[2].compute_s - splits[4].compute_s > 0
