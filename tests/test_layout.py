"""The layout record's split of a pipeline's blocks (nnperf.layout.split_layers): the one place
every caller gets its chunks from, so an uneven request is modelled or refused, never floored."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from nnperf.errors import UsageError
from nnperf.layout import Execution, split_layers


def test_an_even_split_and_llama3_405b_shortened_first_and_last_stages():
    assert split_layers(12, 4) == (3, 3, 3, 3)
    assert split_layers(12, 2, 3) == (2,) * 6  # 2 stages x 3 virtual chunks
    # Llama 3 405B: 126 layers over 16 stages, one layer fewer on the first and the last
    assert split_layers(126, 16, 1, 7, 7) == (7, *(8,) * 14, 7)
    assert split_layers(10, 4, 1, 2, 2) == (2, 3, 3, 2)
    assert split_layers(10, 4, 1, 1, None) == (1, 3, 3, 3)  # the last as the stages between
    assert split_layers(9, 2, 1, None, 4) == (5, 4)


def test_an_end_stage_splits_its_blocks_over_its_chunks():
    """With interleaving the first and last stage's blocks are the stage's, over its chunks (chunk
    c on rank c mod p): evenly where the chunks divide them (Megatron-LM: 20 blocks, 4 stages x 2,
    end stages of 4: 2 + 2 on rank 0, 3 in every middle chunk); else the chunk with the embedding
    (the head) is the shorter: Llama 3 405B, 16 stages x 2, end stages of 7, is 3 + 4 on rank 0,
    4 + 3 on rank 15; Megatron-Bridge's Llama 3.1 405B, 8 x 8 chunks, end stages of 15, is 1 block
    in the model's first and last chunk and 2 in every other."""
    assert split_layers(20, 4, 2, 4, 4) == (2, 3, 3, 2, 2, 3, 3, 2)
    llama3 = split_layers(126, 16, 2, 7, 7)
    assert llama3 == (3, *(4,) * 30, 3) and sum(llama3[0::16]) == sum(llama3[15::16]) == 7
    assert split_layers(126, 8, 8, 15, 15) == (1, *(2,) * 62, 1)
    assert split_layers(21, 3, 2, 5, None) == (2, 4, 4, 3, 4, 4)  # the last stage as the middle one: 8
    assert split_layers(16, 2, 2, 7, None) == (3, 5, 4, 4)  # two stages: the last holds the other 9


def test_an_end_chunk_may_hold_the_embedding_or_the_head_alone():
    """Llama 3 405B as it ran: 16 stages x 8 chunks of one block, "the first model chunk on the
    first stage has only the embedding, and the last model chunk on the last stage has only
    output projection and loss calculation" (Llama 3 paper, 3.3.2): 7 blocks on each end stage,
    8 on every other, 126 in all; no chunk between them is left empty."""
    llama3 = split_layers(126, 16, 8, 7, 7)
    assert llama3 == (0, *(1,) * 126, 0)
    assert sum(llama3[0::16]) == sum(llama3[15::16]) == 7 and sum(llama3[1::16]) == 8
    assert split_layers(6, 4, 2, 1, 1) == (0, 1, 1, 1, 1, 1, 1, 0)
    assert split_layers(5, 2, 2, 1, None) == (0, 2, 1, 2)  # two stages: the last holds the other 4


@pytest.mark.parametrize(("args", "words"), [
    ((10, 4), "10 layers do not split evenly into 4 pipeline stages; nearest valid pipeline degrees: 2 or 5"),
    ((126, 16), "first = last = 7 (8 in each other stage)"),
    ((12, 4, 2), "2 virtual stages do not divide the 3 layers per pipeline stage"),
    ((10, 4, 1, 3, None), "an uneven split with first stage layers 3 cannot hold 10 layers in 4 pipeline stages"),
    ((10, 4, 1, 5, 5), "valid: first = last = 2 (3 in each other stage)"),
    ((10, 4, 2, 2, 2), "cannot hold 10 layers in 4 pipeline stages x 2 virtual stages (the stages between must "
                       "split the rest evenly, each chunk at least 1 block, but the embedding's and the head's, "
                       "which may hold none)"),
    ((12, 4, 2, 1, 1), "valid: first = last = 2 (4 in each other stage)"),  # 10 blocks left for 4 chunks
    ((9, 5), "shorten the first and last stages (--first-stage-layers, --last-stage-layers: first = last = 3 "
             "(1 in each other stage))"),  # none shorter: a longer one named
    # the fewest blocks: the embedding's and the head's chunks empty
    ((10, 4, 2, 2, 2), "valid: first = last = 1 (4 in each other stage); or keep them with --vpp 3 or"),
    ((15, 2), "first = 7, last = 8"),
    # an odd count over 3+ stages has no equal end stages: the first one block shorter is named
    ((61, 16, 1, 3, 4), "valid: first = 2, last = 3 (4 in each other stage)"),
    ((61, 16), "first = 2, last = 3 (4 in each other stage)"),
    # end stages of 6 blocks over 8 chunks would leave a chunk between the embedding's and the
    # block after it empty; Llama 3 405B's 7 are the fewest
    ((126, 16, 8, 6, 6), "valid: first = last = 7 (8 in each other stage)"),
    # no chunk between the end stages may be empty
    ((6, 4, 2, 3, 3), "valid: first = last = 1 (2 in each other stage)"),
])
def test_a_split_that_cannot_hold_the_layers_names_valid_ones(args, words):
    with pytest.raises(UsageError, match=None) as raised:
        split_layers(*args)
    assert words in str(raised.value)


def test_the_layout_gives_each_chunk_and_refuses_stage_layers_without_a_pipeline():
    e = Execution(world=8, pipeline=4, pipeline_schedule="interleaved-1f1b", virtual_stages=2, grad_accum=4)
    assert e.chunk_layers(16) == (2,) * 8 and e.chunks == 8
    assert Execution(world=4, pipeline=4, pipeline_schedule="1f1b", grad_accum=4, first_stage_layers=2,
                     last_stage_layers=2).chunk_layers(10) == (2, 3, 3, 2)
    with pytest.raises(UsageError, match="need pipeline > 1"):
        Execution(world=2, data="ddp", first_stage_layers=2).validate()


def test_megatron_lms_layouts_are_its_data_parallelism_or_its_own_settings_beside_tensor_parallelism():
    """Which tensor-parallel layouts run as Megatron-LM runs them (its cross entropy, its linears
    keeping sequence shards): DDP or ZeRO-1 over 2+ ranks beside TP (torchtitan runs DDP alone),
    or TP with a setting only Megatron-LM has (--tp-comm-overlap, its attention-only
    recomputation), whatever the data parallelism; never FSDP's (torchtitan's), never TP alone."""
    megatron = [Execution(world=8, data="ddp", tensor=4),
                Execution(world=8, data="zero1", tensor=4, sequence_parallel=True),
                Execution(world=4, tensor=4, sequence_parallel=True, checkpoint="selective-attention"),
                Execution(world=4, tensor=4, sequence_parallel=True, tp_comm_overlap=True)]
    torchtitan = [Execution(world=4, tensor=4, sequence_parallel=True),
                  Execution(world=8, data="fsdp", shard=2, tensor=4, sequence_parallel=True),
                  Execution(world=8, data="fsdp", shard=2, tensor=4, checkpoint="selective-op"),
                  Execution(world=8, data="ddp")]
    assert all(e.megatron_tensor_parallel for e in megatron)
    assert not any(e.megatron_tensor_parallel for e in torchtitan)
    # the linears keep their shards where Megatron-LM's blocks are not checkpointed beyond the core attention
    assert [e.keeps_sequence_shards for e in megatron] == [False, True, True, True]
    assert not Execution(world=8, data="zero1", tensor=4, sequence_parallel=True, checkpoint="full").keeps_sequence_shards


def test_a_layouts_selective_recomputation_is_its_engines():
    """The plan's selective level: Megatron-LM's core attention for the layouts only Megatron-LM
    runs (ZeRO-1; DDP beside tensor, pipeline or context parallelism), torchtitan's per-op policy
    for the rest (FSDP, HSDP, DDP alone, a single data-parallel rank); other levels as named."""
    from nnperf.layout import ENGINE_SELECTIVE

    megatron = [Execution(world=8, data="zero1"), Execution(world=8, data="ddp", tensor=2),
                Execution(world=8, data="ddp", pipeline=2, pipeline_schedule="1f1b", grad_accum=2)]
    torchtitan = [Execution(world=8, data="fsdp", shard=8), Execution(world=8, data="hsdp", shard=4),
                  Execution(world=8, data="ddp"), Execution(world=2, tensor=2)]
    assert [e.with_checkpoint(ENGINE_SELECTIVE).checkpoint for e in megatron] == ["selective-attention"] * 3
    assert [e.with_checkpoint(ENGINE_SELECTIVE).checkpoint for e in torchtitan] == ["selective-op"] * 4
    assert Execution(world=8, data="zero1").with_checkpoint("selective-op").checkpoint == "selective-op"
    assert Execution(world=8, data="zero1").with_checkpoint(None).checkpoint is None


def test_megatron_lms_non_interleaved_pipeline_waits_for_its_sends():
    """Sends hold their stage in Megatron-LM's 1F1B (``_communicate(wait_on_reqs=True)``), for
    every layout Megatron-LM runs (ZeRO-1, DDP beside pipelines, its own settings beside a
    pipeline of one data-parallel rank); its interleaved schedule overlaps them
    (``--overlap-p2p-communication``), and so do torch's schedules, which run FSDP's pipelines
    and a plain pipeline without data parallelism."""
    waits = [Execution(world=16, data="zero1", pipeline=4, pipeline_schedule="1f1b", grad_accum=4),
             Execution(world=16, data="ddp", tensor=2, pipeline=4, grad_accum=4),
             Execution(world=8, data="ddp", tensor=2, sequence_parallel=True, tp_comm_overlap=True, pipeline=4,
                       grad_accum=4),
             Execution(world=4, pipeline=4, grad_accum=4, checkpoint="selective-attention")]
    overlaps = [Execution(world=16, data="zero1", pipeline=4, virtual_stages=2, grad_accum=4),
                Execution(world=16, data="fsdp", shard=4, pipeline=4, pipeline_schedule="1f1b", grad_accum=4),
                Execution(world=4, pipeline=4, pipeline_schedule="1f1b", grad_accum=4),
                Execution(world=16, data="zero1", pipeline=4, pipeline_schedule="gpipe", grad_accum=4),
                Execution(world=16, data="zero1")]
    assert all(e.blocking_pipeline_sends for e in waits)
    assert not any(e.blocking_pipeline_sends for e in overlaps)


def test_a_pipeline_given_no_schedule_runs_the_engines_default():
    """Megatron-LM's and torchtitan's default is 1F1B; with virtual stages, Megatron-LM's
    interleaved 1F1B. A layout that cannot run is refused before any of it is traced."""
    assert Execution(world=8, pipeline=4, grad_accum=4).pipeline_schedule == "1f1b"
    assert Execution(world=8, pipeline=4, virtual_stages=2, grad_accum=4).pipeline_schedule == "interleaved-1f1b"
    assert Execution(world=8).pipeline_schedule is None
    assert Execution(world=8, pipeline=4, grad_accum=4) == Execution(world=8, pipeline=4, pipeline_schedule="1f1b",
                                                                      grad_accum=4)


def test_evaluate_refuses_a_layout_that_cannot_run_in_one_line():
    from nnperf.hardware.catalog import load_gpu
    from nnperf.hardware.cluster import load_cluster
    from nnperf.request import ModelRequest
    from nnperf.search.plan import evaluate
    from nnperf.trace.options import TraceOptions

    wrong = Execution(world=8, pipeline=4, pipeline_schedule="interleaved-1f1b", virtual_stages=1, grad_accum=4)
    with pytest.raises(UsageError, match="interleaved-1f1b runs 2 or more model chunks per rank"):
        evaluate(ModelRequest("llama-7b", batch=4), TraceOptions(), wrong, load_gpu("h100-sxm"),
                 load_cluster("dgx-h100"))


def test_megatrons_1f1b_runs_fewer_micro_batches_than_stages_and_torchs_does_not():
    """Megatron-LM's 1F1B (DDP or ZeRO-1 beside the pipeline) warms up with min(stages - rank - 1,
    micro-batches) forwards; torch's Schedule1F1B (FSDP's, torchtitan's) refuses fewer."""
    Execution(world=8, data="zero1", pipeline=4, pipeline_schedule="1f1b", grad_accum=1).validate()
    Execution(world=4, data="ddp", pipeline=4, pipeline_schedule="1f1b", grad_accum=2).validate()
    with pytest.raises(UsageError, match="1f1b needs at least as many micro-batches as stages: 2 < 4"):
        Execution(world=8, data="fsdp", shard=2, pipeline=4, pipeline_schedule="1f1b", grad_accum=2).validate()
    with pytest.raises(UsageError, match="at least as many micro-batches as stages: 2 < 4"):
        Execution(world=8, data="zero1", pipeline=4, pipeline_schedule="interleaved-1f1b", virtual_stages=2,
                  grad_accum=2).validate()


def test_the_shard_group_left_out_is_what_the_engine_implies():
    """A layout written as a source states it ("FSDP beside TP 8 on 992 GPUs") needs no shard
    group: FSDP shards over every data-parallel rank (992 / 8 = 124), DDP and ZeRO-1 shard
    nothing; HSDP's group is a choice, so it is asked for in one line."""
    assert Execution(world=992, data="fsdp", tensor=8).shard == 124
    assert Execution(world=64, data="fsdp", tensor=2, pipeline=4, pipeline_schedule="1f1b", grad_accum=4).shard == 8
    assert Execution(world=16, data="zero1", tensor=2).shard == Execution(world=16, data="ddp").shard == 1
    Execution(world=992, data="fsdp", tensor=8).validate()
    with pytest.raises(UsageError, match="hsdp shards inside a group and replicates across groups: give its shard"):
        Execution(world=16, data="hsdp").validate()


def test_an_interleaved_schedule_needs_micro_batches_in_equal_rounds():
    """torch's interleaved 1F1B runs 128 micro-batches on 12 stages as 128 // 12 = 10 rounds,
    which 128 does not split into (torch refuses it; the plan's replay of its order waited
    forever): one line naming the counts within a stage's count of it that do: 117 (9 rounds of
    13), 120 (10 of 12), 130 (10 of 13) and 132 (11 of 12)."""
    gpt3 = Execution(world=1536, tensor=8, pipeline=12, virtual_stages=4, grad_accum=128)
    with pytest.raises(UsageError, match=r"128 micro-batches over 12 stages do not split into 10 equal rounds; "
                                         r"valid near it: 117, 120, 130, 132 \(a multiple of 12"):
        gpt3.validate()
    for fine in (120, 130, 132, 12, 13):
        Execution(world=1536, tensor=8, pipeline=12, virtual_stages=4, grad_accum=fine).validate()
    Execution(world=1536, tensor=8, pipeline=12, grad_accum=128).validate()  # 1F1B runs any count


def test_a_layout_both_frameworks_run_is_planned_as_the_one_named():
    """Tensor and pipeline parallelism without data parallelism: torch's by default (no setting
    only Megatron-LM has), Megatron-LM's where named; a layout only Megatron-LM runs stays its."""
    both = Execution(world=64, tensor=8, pipeline=8, grad_accum=64)
    assert not both.megatron_layout
    assert replace(both, framework="megatron").megatron_layout
    assert not replace(both, framework="torch").megatron_layout
    assert replace(both, framework="megatron").describe().startswith("Megatron-LM: TP x8, PP x8 1f1b")
    assert replace(both, framework="torch").describe().startswith("torch: TP x8")
    assert Execution(world=128, data="zero1", tensor=8, pipeline=8, grad_accum=64).megatron_layout
    # the selective recomputation a search level names is the framework's own
    assert replace(both, framework="megatron").engine_selective == "selective-attention"
    assert replace(both, framework="torch").engine_selective == "selective-op"


@pytest.mark.parametrize(("layout", "message"), [
    ({"world": 16, "data": "zero1", "tensor": 2}, "framework torch: the layout asks for Megatron-LM's zero1"),
    ({"world": 16, "tensor": 2, "pipeline": 2, "grad_accum": 2},
     "framework torch: the layout asks for Megatron-LM's ddp beside tensor, pipeline or context parallelism"),
    ({"world": 8, "tensor": 8, "sequence_parallel": True, "tp_comm_overlap": True},
     "framework torch: the layout asks for Megatron-LM's --tp-comm-overlap"),
    ({"world": 8, "expert": 8}, "framework torch: the layout asks for Megatron-LM's expert group carved out of "
                                "DDP's replicas"),
    ({"world": 8, "expert": 8, "expert_overlap": True},
     "framework torch: the layout asks for Megatron-LM's expert all-to-alls overlapped across micro-batches "
     "(expert_overlap)"),
])
def test_torch_refuses_what_only_megatron_runs_in_one_line(layout: dict, message: str):
    with pytest.raises(UsageError, match=re.escape(message)):
        Execution(**layout, framework="torch").validate()


def test_a_framework_that_does_not_run_the_layout_is_one_line():
    with pytest.raises(UsageError, match="framework megatron: Megatron-LM's data parallelism is ddp or zero1, "
                                         "not fsdp"):
        Execution(world=8, data="fsdp", framework="megatron").validate()
    with pytest.raises(UsageError, match="unknown framework 'jax'; valid: megatron, torch"):
        Execution(world=8, framework="jax").validate()


def test_the_json_names_the_expert_split_that_runs():
    """Megatron-Core's default split (``expert_tensor`` None) folds the expert group over the
    tensor-parallel ranks only where the data-parallel ranks cannot hold it: EP 2 over DDP x 4
    beside TP 2 splits each expert over the 2 tensor ranks; EP 8 over the same 4 folds (each
    expert whole). The JSON says which, and reads back as the same layout."""
    from nnperf.measure.plan_file import execution_of

    split = Execution(world=8, data="zero1", tensor=2, sequence_parallel=True, expert=2)
    folded = replace(split, expert=8)
    assert split.to_json()["expert_tensor"] == 2 and folded.to_json()["expert_tensor"] == 1
    assert Execution(world=8, data="zero1", expert=4).to_json()["expert_tensor"] == 1  # no tensor parallelism
    assert Execution(world=8, tensor=2).to_json()["expert_tensor"] is None  # no expert parallelism
    for layout in (split, folded):
        back = execution_of(layout.to_json(), "layout")
        assert back.folds_experts == layout.folds_experts and back.describe() == layout.describe()


@pytest.mark.parametrize(("layout", "message"), [
    ({"world": 8, "expert_overlap": True}, "it needs expert parallelism (expert > 1) beside ddp or zero1"),
    ({"world": 16, "expert": 8, "pipeline": 2, "pipeline_schedule": "1f1b", "grad_accum": 4, "expert_overlap": True},
     "expert_overlap with a pipeline needs virtual stages (Megatron-Core's check): 1f1b is not interleaved; valid: "
     "interleaved-1f1b with virtual_stages 2 or more, or pipeline 1"),
    ({"world": 8, "expert": 8, "checkpoint": "full", "expert_overlap": True},
     "expert_overlap runs without full recomputation (Megatron-Core's check); valid checkpoints: none, selective"),
])
def test_the_expert_overlap_where_megatron_core_refuses_it_is_one_line(layout: dict, message: str):
    with pytest.raises(UsageError, match=re.escape(message)):
        Execution(**layout).validate()


def test_a_fully_recomputed_layout_runs_without_the_expert_overlap():
    e = Execution(world=8, data="zero1", expert=8, expert_overlap=True)
    assert e.megatron_layout and "all-to-alls overlapped" in e.describe()
    assert not e.with_checkpoint("full").expert_overlap
    assert e.with_checkpoint("selective").expert_overlap
