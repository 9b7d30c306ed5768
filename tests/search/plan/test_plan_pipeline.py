"""What a rank's other pipeline chunks hold unsharded under FSDP2 (``plan.pipeline.unsharded_extra``)
against torch's own lowering of the same schedule (``torch_lowering``: which stages are gathered
when, and when a stage's accumulated gradient is reduced and freed)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from torch_lowering import most_held

from nnperf.hardware.catalog import load_gpu
from nnperf.hardware.cluster import load_cluster
from nnperf.layout import Execution
from nnperf.request import ModelRequest
from nnperf.search.plan import evaluate
from nnperf.search.plan.pipeline import rank_orders, unsharded_extra
from nnperf.search.plan.rank import RoleCache
from nnperf.trace.options import TraceOptions

GATHERED, GRADIENT = 1.0, 1000.0  # one chunk's bytes of each: a sum tells how many of each


@pytest.mark.parametrize(("pipeline", "virtual", "micro"), [
    (4, 2, 4), (4, 2, 6), (4, 2, 8), (4, 3, 6), (4, 3, 12), (4, 4, 8), (4, 4, 16), (8, 2, 12), (8, 4, 16),
    (8, 8, 64), (2, 5, 10),
])
def test_other_chunks_unsharded_as_torch_lowers_the_schedule(pipeline, virtual, micro):
    """Within one round of micro-batches (fewer than twice the stages) each chunk's backwards end
    before the next chunk's begin, so no other chunk holds a gradient; from two rounds on the
    chunks take turns and hold their gradients, and at most two other stages are gathered
    (torch keeps three active)."""
    execution = Execution(world=pipeline, pipeline=pipeline, pipeline_schedule="interleaved-1f1b",
                          virtual_stages=virtual, micro_batch=1, grad_accum=micro)
    order = rank_orders(execution)
    for rank in range(pipeline):
        ours = unsharded_extra(order[rank], rank, lambda s: GATHERED, lambda s: GRADIENT)
        assert ours == most_held(pipeline, virtual, micro, rank, GATHERED, GRADIENT), rank
    held = unsharded_extra(order[0], 0, lambda s: GATHERED, lambda s: GRADIENT)
    assert (held >= GRADIENT) == (micro >= 2 * pipeline)
    assert held % GRADIENT <= 2 * GATHERED


def test_a_rank_holds_its_chunks_micro_batches_at_once_not_each_chunks_peak():
    """Two chunks (stages 0 and 1) on one rank, two micro-batches: each chunk reaches 2 in
    flight, never both at once. By hand, micro-batch chunks held after each action: 1, 2, 3, 2,
    3, 2, 1, 0: at most 3, where the chunks' own peaks add up to 4."""
    from nnperf.passes.pipeline_timeline import parse
    from nnperf.search.plan.pipeline import peak_saved

    actions = [parse(label) for label in ("F0@0", "F1@0", "F0@1", "B0@1", "F1@1", "B0@0", "B1@1", "B1@0")]
    assert peak_saved(actions, lambda stage: 1.0) == 3
    assert peak_saved(actions, lambda stage: 10.0 if stage == 1 else 1.0) == 12  # F0@0 F1@0 F0@1
    # the interleaved schedule of 8 stages x 5 chunks and 64 micro-batches: rank 0's warm-up is
    # (5 - 1) x 8 + 2 x (8 - 1) = 46 forwards (torch's ScheduleInterleaved1F1B), then 1F1B
    execution = Execution(world=8, pipeline=8, pipeline_schedule="interleaved-1f1b", virtual_stages=5,
                          micro_batch=1, grad_accum=64)
    assert peak_saved(rank_orders(execution)[0], lambda stage: 1.0) == 46 + 1


@pytest.mark.slow
def test_an_interleaved_ranks_time_split_counts_every_chunk():
    """A rank runs each of its chunks for every micro-batch: its host time and communication
    over the step are its chunks' together. Two stages of a tiny Llama's 8 blocks: 4 blocks a
    rank either way, as one chunk (1F1B) or four of one block (interleaved); the same ops are
    issued, so the host times agree up to the chunks' own overhead (before, the interleaved
    split counted one chunk: a quarter)."""
    from nnperf.hardware.catalog import load_gpu
    from nnperf.hardware.cluster import load_cluster
    from nnperf.request import ModelRequest
    from nnperf.search.plan import evaluate
    from nnperf.search.plan.rank import RoleCache
    from nnperf.trace.options import TraceOptions

    request = ModelRequest("llama-7b", batch=8, seq_len=64, overrides={
        "n_layer": 8, "dim": 64, "n_heads": 4, "n_kv_heads": 4, "ffn_hidden": 128, "vocab": 256})
    gpu, cluster = load_gpu("h100-sxm"), load_cluster("dgx-h100")
    splits = {}
    for schedule, chunks in (("1f1b", 1), ("interleaved-1f1b", 4)):
        execution = Execution(world=4, data="ddp", pipeline=2, pipeline_schedule=schedule, virtual_stages=chunks,
                              micro_batch=1, grad_accum=8)
        splits[schedule] = evaluate(request, TraceOptions(), execution, gpu, cluster, layers=8,
                                    cache=RoleCache()).split
    ratio = splits["interleaved-1f1b"].host_s / splits["1f1b"].host_s
    assert 1.0 <= ratio < 1.25
    assert splits["interleaved-1f1b"].communication_s > splits["1f1b"].communication_s


def test_a_pipelines_time_split_adds_up_to_its_step():
    """Compute, exposed communication, bubble and what follows the schedule partition a
    pipeline's step: an action's time holds its waits for tensor-parallel collectives, which
    the split reports as exposed, not as compute too (a plan said "92% of the step is compute,
    15% exposed communication, 7% pipeline bubble"). TP 2 x PP 2 on 4 GPUs: no data-parallel
    synchronization at the step's ends, so the parts add up exactly."""
    from nnperf.hardware.catalog import load_gpu
    from nnperf.hardware.cluster import load_cluster
    from nnperf.request import ModelRequest
    from nnperf.search.plan import evaluate
    from nnperf.search.plan.rank import RoleCache
    from nnperf.trace.options import TraceOptions

    request = ModelRequest("llama-7b", batch=4, seq_len=2048, overrides={
        "n_layer": 4, "dim": 2048, "n_heads": 16, "n_kv_heads": 16, "ffn_hidden": 8192, "vocab": 256})
    execution = Execution(world=4, data="ddp", tensor=2, pipeline=2, pipeline_schedule="1f1b", micro_batch=1,
                          grad_accum=4)
    planned = evaluate(request, TraceOptions(), execution, load_gpu("h100-sxm"), load_cluster("dgx-h100"),
                       layers=4, cache=RoleCache())
    split = planned.split
    assert split.exposed_communication_s.get("all_reduce", 0.0) > 0  # the actions waited for some
    parts = split.compute_s + split.exposed_s + split.pipeline_bubble_s + split.after_schedule_s
    assert parts == pytest.approx(planned.step_s, rel=1e-9)


def test_an_interleaved_ranks_state_bytes_count_every_chunk():
    """A bf16 Llama of 4 blocks (dim 256, 4 heads, FFN 512, vocabulary 1000) on 2 stages of 2
    chunks: the split reports the busier rank 1, which holds blocks 1 and 3 (4 x 256^2
    attention, 3 x 256 x 512 MLP, 2 x 256 norms each), the final norm (256) and the head
    (1000 x 256), 2 bytes an element: its parameters and gradients (the plan reported its
    first chunk's alone). By hand."""
    from nnperf.hardware.catalog import load_gpu
    from nnperf.hardware.cluster import load_cluster
    from nnperf.request import ModelRequest
    from nnperf.search.plan import evaluate
    from nnperf.search.plan.rank import RoleCache
    from nnperf.trace.options import TraceOptions

    request = ModelRequest("llama-7b", batch=1, seq_len=128, overrides={
        "n_layer": 4, "dim": 256, "n_heads": 4, "n_kv_heads": 4, "ffn_hidden": 512, "vocab": 1000})
    execution = Execution(world=4, data="zero1", pipeline=2, pipeline_schedule="interleaved-1f1b",
                          virtual_stages=2, micro_batch=1, grad_accum=4)
    planned = evaluate(request, TraceOptions(dtype="bf16"), execution, load_gpu("h100-sxm"),
                       load_cluster("dgx-h100"), layers=4, cache=RoleCache())
    block = 4 * 256 * 256 + 3 * 256 * 512 + 2 * 256
    assert planned.pipeline.critical_rank == 1
    assert planned.state_bytes.parameters == planned.state_bytes.gradients == 2 * (1000 * 256 + 2 * block + 256)


def test_a_ranks_host_counts_its_optimizer_step_once():
    """A rank's host issues each micro-batch's forward and backward, and its optimizer step once:
    over 4 and 8 micro-batches of the same traced roles the host grows by 4 micro-batches, so
    twice the 4's less the 8's is the optimizer's issue alone, more than nothing (it was counted
    once per micro-batch before, making the host exactly proportional to them)."""
    from nnperf.hardware.catalog import load_gpu
    from nnperf.hardware.cluster import load_cluster
    from nnperf.request import ModelRequest
    from nnperf.search.plan import evaluate
    from nnperf.search.plan.rank import RoleCache
    from nnperf.trace.options import TraceOptions

    request = ModelRequest("llama-7b", batch=8, seq_len=64, overrides={
        "n_layer": 4, "dim": 64, "n_heads": 4, "n_kv_heads": 4, "ffn_hidden": 128, "vocab": 256})
    gpu, cluster = load_gpu("h100-sxm"), load_cluster("dgx-h100")
    cache = RoleCache()
    host = {}
    for micro in (4, 8):
        execution = Execution(world=2, data="ddp", pipeline=2, pipeline_schedule="1f1b", micro_batch=1,
                              grad_accum=micro)
        host[micro] = evaluate(request, TraceOptions(), execution, gpu, cluster, layers=4, cache=cache).split.host_s
    optimizer = 2 * host[4] - host[8]
    assert 0.01 * host[4] < optimizer < host[4] / 4


def test_a_ranks_optimizer_step_holds_no_activations_and_its_chunks_temporaries():
    """The rank's peak is the larger of its forward/backward with the in-flight micro-batches
    added, and its optimizer step with its later chunks' optimizer temporaries added (no
    activation is saved by then); by hand, in GiB: backward 12 + 5 in flight against optimizer
    9 + 7, plus 1 outside the allocator: 18; with 1 in flight the optimizer step binds: 17."""
    from nnperf.search.plan.pipeline import phase_peak
    from nnperf.search.plan.results import RankFigures

    gib = 2**30
    figures = RankFigures(memory_by_phase={"forward": 10 * gib, "backward": 12 * gib, "optimizer": 9 * gib},
                          mem_outside=1 * gib)
    assert phase_peak(figures, 5 * gib, 7 * gib) == 18 * gib
    assert phase_peak(figures, 1 * gib, 7 * gib) == 17 * gib


def test_megatron_steps_all_chunks_at_once_torchtitan_one_after_another():
    """Megatron-LM's one optimizer over a rank's chunks: their temporaries add (2 + 3); torchtitan's
    optimizer per chunk: the largest later one beyond the first chunk's own (3 - 1)."""
    from nnperf.search.plan.pipeline import later_optimizers
    from nnperf.search.plan.results import RankFigures

    own, later = RankFigures(optimizer_rise=1.0), [RankFigures(optimizer_rise=2.0), RankFigures(optimizer_rise=3.0)]
    megatron = Execution(world=4, data="zero1", pipeline=2, pipeline_schedule="interleaved-1f1b", virtual_stages=3)
    torchtitan = Execution(world=4, data="fsdp", shard=2, pipeline=2, pipeline_schedule="interleaved-1f1b",
                           virtual_stages=3)
    assert megatron.megatron_layout and not torchtitan.megatron_layout
    assert later_optimizers(megatron, own, later) == 5.0
    assert later_optimizers(torchtitan, own, later) == 2.0


def test_megatron_lms_1f1b_stage_waits_for_each_of_its_sends(monkeypatch):
    """A tiny Llama on two stages, one per node, ZeRO-1 (Megatron-LM's layout) with 1F1B over 8
    micro-batches: each rank sends 8 times (rank 0 its activations, rank 1 their gradients), each
    send one micro-batch's activation (1 x 64 tokens x 64 fp32 = 16 KiB) over the nodes' link, and
    Megatron-LM waits for each. The plan's exposed send time is the overlapped plan's plus 8 such
    sends, and its step is longer; its communication is the same either way (the sends happen
    overlapped or not) and holds what is exposed."""
    from nnperf.hardware.catalog import load_gpu
    from nnperf.hardware.cluster import load_cluster
    from nnperf.kernels.collectives import estimate_collective
    from nnperf.request import ModelRequest
    from nnperf.search.plan import evaluate
    from nnperf.search.plan.rank import RoleCache
    from nnperf.trace.options import TraceOptions

    request = ModelRequest("llama-7b", batch=8, seq_len=64, overrides={
        "n_layer": 4, "dim": 64, "n_heads": 4, "n_kv_heads": 4, "ffn_hidden": 128, "vocab": 256})
    gpu, cluster = load_gpu("h100-sxm"), load_cluster("dgx-h100")
    execution = Execution(world=16, data="zero1", pipeline=2, pipeline_schedule="1f1b", micro_batch=1,
                          grad_accum=8)
    assert execution.blocking_pipeline_sends
    cache = RoleCache()
    waited = evaluate(request, TraceOptions(), execution, gpu, cluster, layers=4, cache=cache)
    monkeypatch.setattr(Execution, "blocking_pipeline_sends", property(lambda self: False))
    overlapped = evaluate(request, TraceOptions(), execution, gpu, cluster, layers=4, cache=cache)
    send = estimate_collective("send_recv", 1 * 64 * 64 * 4, (0, 8), cluster).time_s
    assert waited.pipeline.transfer_bytes == 1 * 64 * 64 * 4
    exposed = waited.split.exposed_communication_s.get("send_recv", 0.0)
    assert exposed - overlapped.split.exposed_communication_s.get("send_recv", 0.0) == pytest.approx(8 * send)
    assert waited.split.communication_s == pytest.approx(overlapped.split.communication_s)
    assert waited.split.communication_s >= waited.split.exposed_s
    assert waited.step_s > overlapped.step_s


def test_megatrons_stage_holds_only_its_blocks_inputs_per_micro_batch_in_flight():
    """Megatron-LM frees the data of each output it sends (``deallocate_output_tensor``) and
    receives an output's gradient only for its backward, so with full recomputation one more
    micro-batch in flight on the first stage holds its blocks' inputs alone: the embedding's
    output and three blocks' outputs, each micro-batch x sequence x dim in fp32. 16 blocks on 4
    stages (DDP x 2 beside them: a layout only Megatron-LM runs), 4 micro-batches against 3: rank
    0 holds one more in flight (counted as torch holds them, 6 such tensors)."""
    micro_batch, seq, dim = 4, 2048, 128
    execution = Execution(world=8, data="ddp", pipeline=4, pipeline_schedule="1f1b", micro_batch=micro_batch,
                          checkpoint="full")
    model = {"dim": dim, "n_heads": 4, "ffn_hidden": 256, "vocab": 512, "n_layer": 16}
    memory = {}
    for micro_batches in (3, 4):
        request = ModelRequest("llama-7b", batch=micro_batch * micro_batches * 2, seq_len=seq, overrides=model)
        memory[micro_batches] = evaluate(request, TraceOptions(amp="bf16"), replace(execution, grad_accum=micro_batches),
                                         load_gpu("h100"), load_cluster("dgx-h100"), layers=16,
                                         cache=RoleCache()).memory_bytes
    assert memory[4] - memory[3] == pytest.approx(4 * micro_batch * seq * dim * 4, abs=2)


@pytest.mark.parametrize(("schedule", "virtual", "micro"), [("1f1b", 1, 41), ("interleaved-1f1b", 2, 40),
                                                            ("zero-bubble", 2, 40)])
def test_a_long_schedule_is_the_line_through_two_shorter_replays(monkeypatch, schedule, virtual, micro):
    """Beyond REPLAYED_MICRO_BATCHES the schedule is replayed at two whole-round counts and read
    off the line through them: here (2 stages, at most 8 replayed: 8 and 10) the same step,
    bubble and memory as replaying every one of the micro-batches, for 1F1B at a count that is
    not a whole number of rounds and for the interleaved schedules at one that is."""
    import nnperf.passes.pipeline_timeline as timeline
    import nnperf.search.plan.pipeline as plan_pipeline

    execution = Execution(world=2, pipeline=2, pipeline_schedule=schedule, virtual_stages=virtual, micro_batch=1,
                          grad_accum=micro)
    request = ModelRequest("llama-7b", batch=micro, seq_len=64, overrides={
        "n_layer": 4, "dim": 64, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 128, "vocab": 256})
    gpu, cluster = load_gpu("h100-sxm"), load_cluster("dgx-h100")

    def planned(limit: int):
        monkeypatch.setattr(plan_pipeline, "REPLAYED_MICRO_BATCHES", limit)
        return evaluate(request, TraceOptions(amp="bf16"), execution, gpu, cluster, layers=4, cache=RoleCache())

    read_off = []
    monkeypatch.setattr(plan_pipeline, "extended", lambda *args: read_off.append(args[2:]) or timeline.extended(*args))
    whole, lined = planned(10**6), planned(8)
    assert read_off == [(8, 10, micro)]
    assert lined.step_s == pytest.approx(whole.step_s, rel=1e-9)
    assert lined.split.pipeline_bubble_s == pytest.approx(whole.split.pipeline_bubble_s, rel=1e-9, abs=1e-12)
    assert lined.split.compute_s == pytest.approx(whole.split.compute_s, rel=1e-9)
    assert lined.memory_bytes == whole.memory_bytes and lined.pipeline.in_flight == whole.pipeline.in_flight
