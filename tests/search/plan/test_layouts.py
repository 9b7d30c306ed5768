"""The candidate layouts (search.plan.layouts): which engines each tensor x pipeline degree gets,
which splits of the layers the pipelines take, and a global batch the data-parallel ranks cannot
split."""

from __future__ import annotations

import pytest

from nnperf.errors import UsageError
from nnperf.search.plan.layouts import (
    PipelineSplitChoice,
    check_expert_degrees,
    layouts,
    why_no_layout,
)


def test_megatrons_data_parallelism_beside_tensor_and_pipeline_parallelism():
    """DDP and ZeRO-1 now go with every tensor x pipeline degree, as FSDP and HSDP do (8 GPUs of
    node each: HSDP shards over the 4 tensor-parallel groups of a node)."""
    found = layouts(32, 8, 64, tensor=[2], pipeline=[2], schedules=["1f1b"])
    assert {e.data for e in found} == {"ddp", "zero1", "fsdp", "hsdp"}
    assert all(e.tensor == 2 and e.pipeline == 2 for e in found)


def test_a_global_batch_only_model_parallelism_can_split():
    """12 sequences over 8 GPUs: no data parallelism alone (one line naming valid batches), but
    tensor parallelism 2 leaves 4 data-parallel ranks of 3 sequences each."""
    with pytest.raises(UsageError, match="--global-batch 12 does not divide over 8 data-parallel ranks"):
        layouts(8, 8, 12)
    found = layouts(8, 8, 12, tensor=[1, 2])
    assert found and {e.tensor for e in found} == {2} and {e.global_batch for e in found} == {12}


def test_virtual_stages_and_shortened_stages_the_layers_allow():
    """24 layers over 4 stages, 6 a rank: interleaving with 2 or 3 chunks per rank (3 or 2 layers
    a chunk); 5 chunks do not divide them and are left out. 12 layers with the first and last
    stages shortened to 2 need the 2 between at 4 each: 2 + 4 + 4 + 2; with 5 and 4, the 3 left do not
    split over the 2 between."""
    split = PipelineSplitChoice(virtual=(2, 3, 5))
    found = layouts(8, 8, 16, pipeline=[4], schedules=["interleaved-1f1b"], layers=24, split=split)
    assert {e.virtual_stages for e in found} == {2, 3}
    uneven = layouts(8, 8, 16, pipeline=[4], schedules=["1f1b"], layers=12, split=PipelineSplitChoice(first=2, last=2))
    assert uneven and all(e.chunk_layers(12) == (2, 4, 4, 2) for e in uneven)
    assert not layouts(8, 8, 16, pipeline=[4], schedules=["1f1b"], layers=12, split=PipelineSplitChoice(first=5, last=4))


def test_micro_batch_counts_each_schedule_runs():
    """BLOOM's layout (384 GPUs, TP 4, PP 12: 8 data-parallel ranks of 256 sequences each): 1F1B
    runs any count of micro-batches from one a stage up that divides the 256 (16, 32, 64, 128,
    256: its published micro-batch of 2 is 128 of them), none a multiple of the 12 stages;
    Megatron-LM's interleaved schedule only multiples of the stages (here none), GPipe any."""
    def counts(schedule: str, **kw: object) -> set[int]:
        found = layouts(384, 8, 2048, tensor=[4], pipeline=[12], schedules=[schedule], **kw)
        return {e.grad_accum for e in found if e.data == "zero1"}

    assert counts("1f1b") == {16, 32, 64, 128, 256}
    assert counts("interleaved-1f1b", layers=72) == set()
    assert counts("gpipe") == {1, 2, 4, 8, 16, 32, 64, 128, 256}
    assert {e.micro_batch for e in layouts(384, 8, 2048, tensor=[4], pipeline=[12], schedules=["1f1b"])
            if e.grad_accum == 128} == {2}


def test_a_rank_with_fewer_samples_than_stages_runs_megatrons_1f1b():
    """The SC21 paper's schedule figures: 32 GPUs, pipeline 16, global batch 4 (2 data-parallel
    ranks of 2 samples). Megatron-LM's 1F1B (DDP, ZeRO-1) runs them as 1 or 2 micro-batches;
    FSDP (torch's Schedule1F1B) none; with 32 samples a rank, only counts of a stage or more."""
    found = layouts(32, 8, 4, pipeline=[16], schedules=["1f1b"])
    assert {(e.data, e.grad_accum) for e in found} == {(d, m) for d in ("ddp", "zero1") for m in (1, 2)}
    assert {e.grad_accum for e in layouts(32, 8, 64, pipeline=[16], schedules=["1f1b"])} == {16, 32}


def test_why_fixed_degrees_leave_no_layout():
    """Named: too few micro-batches for the stages, with the global batches that have enough;
    a global batch the data-parallel ranks cannot split, with the nearest that runs (FSDP's 1F1B
    over 4 stages needs 4 micro-batches a rank: of 2 ranks' batches, 8 above 5, none below);
    nothing where the degrees are searched."""
    why = why_no_layout(8, 8, 6, [1], [4], [1], ["interleaved-1f1b"], {"zero1"})
    assert why == ("a data-parallel rank's 3 samples of the global batch 6 (2 data-parallel ranks) make too few "
                   "micro-batches for 4 pipeline stages: the schedules run a multiple of the stages (interleaved); "
                   "try --global-batch 8 (a multiple of 2 ranks x 4 stages)")
    fsdp = why_no_layout(8, 8, 2, [1], [4], [1], ["1f1b"], {"fsdp"})
    assert fsdp is not None and fsdp.endswith("or --data ddp or zero1 (Megatron-LM's 1F1B runs fewer)")
    assert why_no_layout(8, 8, 6, [1, 2], [4], [1], ["1f1b"], {"fsdp"}) is None  # searched
    assert why_no_layout(8, 8, 5, [1], [4], [1], ["1f1b"], {"fsdp"}) == (
        "the global batch 5 does not divide over the 2 data-parallel ranks (8 GPUs / (tp 1 x pp 4)); try "
        "--global-batch 8")
    # Megatron-LM's 1F1B (ZeRO-1) runs fewer micro-batches than stages: 4 (2 a rank) runs too
    assert why_no_layout(8, 8, 5, [1], [4], [1], ["1f1b"], {"zero1"}).endswith("try --global-batch 4 or 6")
    # micro-batches of 2: 4 (one a rank, fewer than the stages: the short 1F1B) and 16 (4 a rank);
    # 8 gives a rank 4 samples, which make 4 micro-batches, so the short pipeline is not searched
    assert why_no_layout(8, 8, 5, [1], [4], [1], ["1f1b"], {"zero1"}, {2}).endswith(
        "(8 GPUs / (tp 1 x pp 4)) in micro-batches of 2; try --global-batch 4 or 16")
    # no pipeline: any multiple of the 4 ranks runs, whatever the schedules (none here)
    assert why_no_layout(8, 8, 18, [2], [1], [1], [], {"zero1"}).endswith("try --global-batch 16 or 20")
    # zero-bubble does not run beside ZeRO-1's reducer over 2 ranks: no global batch runs, none named
    assert why_no_layout(8, 8, 5, [1], [4], [1], ["zero-bubble"], {"zero1"}) == (
        "the global batch 5 does not divide over the 2 data-parallel ranks (8 GPUs / (tp 1 x pp 4))")
    assert why_no_layout(8, 8, 5, [1], [4], [1], ["zero-bubble"], {"zero1", "fsdp"}).endswith(
        "try --global-batch 8")  # FSDP's zero-bubble: 4 micro-batches a rank, a multiple of the stages


def test_expert_parallelism_divides_ddp_and_zero1_replicas_as_fsdps_shard_group():
    """16 GPUs, pipeline 2: 8 data-parallel ranks. EP 4 takes DDP and ZeRO-1 (8 replicas) and
    FSDP (a shard group of 8); with tensor parallelism (4 data-parallel ranks), only DDP and
    ZeRO-1 take it (Megatron-Core's expert tensor parallelism; torchtitan's is not modelled)."""
    found = layouts(16, 8, 32, tensor=[1, 2], pipeline=[2], schedules=["1f1b"], expert=[1, 4])
    with_experts = [e for e in found if e.expert == 4]
    assert {e.data for e in with_experts} >= {"ddp", "zero1", "fsdp"}
    assert {e.data for e in with_experts if e.tensor == 2} == {"ddp", "zero1"}
    assert all((e.replicate if e.replicates_parameters else e.shard) % 4 == 0 for e in with_experts)


def test_only_the_expert_degrees_asked_for():
    """--ep 4 tries expert parallelism 4 only, as --tp 2 tries tensor parallelism 2 only; 1 is
    one of the degrees when asked for (the default, and auto)."""
    assert {e.expert for e in layouts(16, 8, 32, pipeline=[2], schedules=["1f1b"], expert=[4])} == {4}
    assert {e.expert for e in layouts(16, 8, 32, pipeline=[2], schedules=["1f1b"], expert=[1, 4])} == {1, 4}
    # 8 GPUs over 2 stages: 4 data-parallel ranks, which expert parallelism 8 cannot divide
    assert layouts(8, 8, 8, pipeline=[2], schedules=["1f1b"], expert=[8]) == []


def test_an_expert_degree_no_group_can_carry_is_one_line():
    """16 GPUs over 4 stages leave 4 data-parallel ranks (DDP's replicas, FSDP's shard group):
    --ep 8 divides none, and the line names 4 and what divides it and the 8 experts. With every
    layout tensor-parallel and FSDP's, the line says tensor parallelism goes beside ddp or zero1."""
    common = dict(schedules=["1f1b"], kinds={"ddp", "zero1", "fsdp"}, expert_count=8)

    def check(gpus, batch, tp, pp, ep):
        check_expert_degrees(gpus, 8, batch, tensor=tp, pipeline=pp, context=[1], expert=ep, **common)

    with pytest.raises(UsageError, match=r"--ep 8 divides none .*: 4 here; valid: 2, 4$"):
        check(16, 32, [1], [4], [8])
    with pytest.raises(UsageError, match=r"--ep 2: .* tensor parallelism only beside ddp or zero1"):
        check_expert_degrees(16, 8, 32, tensor=[2], pipeline=[1], context=[1], expert=[2],
                             **{**common, "kinds": {"fsdp"}})
    check(16, 32, [2], [1], [2])  # beside DDP or ZeRO-1: Megatron-Core's expert tensor parallelism
    # one degree some group divides, or 1 among them: the search goes on
    check(16, 32, [1], [4], [4, 8])
    check(16, 32, [1], [4], [1, 8])
    # 8 GPUs over 4 stages leave 2 replicas: --ep 4 divides none, 2 would
    with pytest.raises(UsageError, match=r"2 here; valid: 2$"):
        check(8, 8, [1], [4], [4])
    # --tp 1,2 asked, TP 1's layouts lost to the global batch (8 over 16 replicas): the
    # search's own line says that, not this one
    check(16, 8, [1, 2], [1], [2])
    # every GPU a stage: no replica to spread the experts over
    with pytest.raises(UsageError, match="1 here; valid: none above 1"):
        check(8, 8, [1], [8], [2])
