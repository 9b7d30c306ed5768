"""Megatron-Core's expert overlap (``search.plan.expert_overlap``): the combined step of one MoE
layer's forward and backward worked by hand from Megatron-Core's two-stream order, the layer
cut read off a hand-built timeline, and the plan of a small mixture of experts with and without
it (a fake trace on gloo-free fake ranks: seconds)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from nnperf.errors import UsageError
from nnperf.hardware.catalog import load_gpu
from nnperf.hardware.cluster import load_cluster
from nnperf.layout import Execution
from nnperf.passes.comm_timeline import CommSlice, CommStep, Contention
from nnperf.request import ModelRequest
from nnperf.search.plan import evaluate
from nnperf.search.plan.expert_overlap import LayerPair, Side, hidden_all_to_alls, layer_pairs
from nnperf.search.plan.rank import RoleCache
from nnperf.trace.options import TraceOptions


def _pair(**slowdowns: float) -> LayerPair:
    """Attention 3 and 6, experts 4 and 5 (forward, backward); dispatch 2 and 3, combine 1 and 2."""
    return LayerPair(attention_forward=Side(3.0, slowdowns.get("af", 1.0)), dispatch_s=2.0,
                     experts_forward=Side(4.0, slowdowns.get("ef", 1.0)), combine_s=1.0, combine_backward_s=2.0,
                     experts_backward=Side(5.0, slowdowns.get("eb", 1.0)), dispatch_backward_s=3.0,
                     attention_backward=Side(6.0, slowdowns.get("ab", 1.0)), serial_s=26.0)


def test_the_combined_step_is_its_four_columns_each_the_longer_side():
    # combine_bwd | attention_fwd, dispatch_fwd | experts_bwd, dispatch_bwd | experts_fwd,
    # combine_fwd | attention_bwd: max(2, 3) + max(2, 5) + max(3, 4) + max(1, 6)
    assert _pair().combined_s() == pytest.approx(3 + 5 + 4 + 6)
    # one after the other 26 (every part), so the combined step saves the shorter of each column
    assert _pair().saved_s() == pytest.approx(2 + 2 + 3 + 1)


def test_compute_beside_a_collective_runs_at_its_slowdown_while_the_collective_lasts():
    # attention 3 at half speed beside the 2 of the combine's backward: 1 of its work done by
    # then, 2 left at full speed: 4
    assert _pair(af=2.0).combined_s() == pytest.approx(4 + 5 + 4 + 6)
    # experts 4 at 1.5x beside 3: 2 done in those 3 s, 2 left: 5
    assert _pair(ef=1.5).combined_s() == pytest.approx(3 + 5 + 5 + 6)
    # a collective longer than its slowed compute: the column is the collective's
    short = replace(_pair(), experts_forward=Side(1.0, 2.0))
    assert short.combined_s() == pytest.approx(3 + 5 + 3 + 6)


def test_a_combined_step_never_costs_more_than_the_serial_one():
    slow = replace(_pair(), serial_s=10.0)
    assert slow.saved_s() == 0.0


@dataclass
class _Event:
    index: int
    phase: str
    module: str


@dataclass
class _Collective:
    index: int
    kind: str
    phase: str
    module: str


@dataclass
class _Op:
    index: int
    kernel_s: float
    model_compute_s: float = 1.0  # compute-bound: a contention's SM share slows it
    model_memory_s: float = 0.0
    overhead_s: float = 0.0


@dataclass
class _Trace:
    events: list


def test_a_layer_is_cut_at_its_all_to_alls_on_the_traced_clock():
    """One block's forward (events 0-7) and backward (8-15): attention, the dispatch's two
    all-to-alls (the counts, the rows), the experts, the combine, then the combine's backward,
    the experts' backward, the dispatch's backward and the attention's backward; each compute
    op 1 s, each all-to-all waited for in full by the op after it."""
    block, moe = "layers.0", "layers.0.moe"
    modules = {0: block, 1: block, 2: moe, 3: moe, 4: moe, 5: moe, 6: moe, 7: block,
               8: block, 9: moe, 10: moe, 11: moe, 12: moe, 13: block, 14: block, 15: block}
    phases = {i: "forward" if i < 8 else "backward" for i in modules}
    events = [_Event(i, phases[i], modules[i]) for i in range(16)] + [_Event(16, "optimizer", "(optimizer)")]
    a2a = {2: 0.5, 3: 2.0, 5: 1.5, 9: 1.0, 11: 3.0}  # event -> seconds
    collectives = [_Collective(i, "all_to_all", phases[i], f"{moe}.experts") for i in a2a]
    # the compute stream's clock before each event, worked by hand: compute ops take 1 s; the
    # rows' all-to-all starts when the counts' ends, and the op after each waits for it
    clock = {0: 0, 1: 1, 2: 2, 3: 2, 4: 2, 5: 5.5, 6: 5.5, 7: 8, 8: 9, 9: 10, 10: 10, 11: 12, 12: 12, 13: 16,
             14: 17, 15: 18, 16: 19}
    slices = [CommSlice(2, "all_to_all", 1, 2, 2.5), CommSlice(3, "all_to_all", 1, 2.5, 4.5),
              CommSlice(5, "all_to_all", 1, 5.5, 7), CommSlice(9, "all_to_all", 1, 10, 11),
              CommSlice(11, "all_to_all", 1, 12, 15)]
    waits = [(4, 3, 2.5), (6, 5, 1.5), (10, 9, 1.0), (12, 11, 3.0)]
    comm = CommStep(step_s=20.0, compute_s=0.0, comm_s=0.0, slices=slices, clock=clock, waits=waits)
    ops = [_Op(i, 0.0 if i in a2a else 1.0) for i in range(17)]
    pairs = layer_pairs(_Trace(events), collectives, comm, ops, lambda i: None, [moe])
    assert len(pairs) == 1
    p = pairs[0]
    # forward: ops 0, 1 (attention), then the two dispatch all-to-alls back to back (0.5, 2),
    # op 4 (experts), the combine (1.5), ops 6, 7 after it
    assert p.attention_forward.compute_s == pytest.approx(2.0)
    assert p.dispatch_s == pytest.approx(2.5)
    assert p.experts_forward.compute_s == pytest.approx(1.0)
    assert p.combine_s == pytest.approx(1.5 + 2.0)
    # backward: op 8 (before the combine's backward, in its node), the all-to-all (1), op 10,
    # the dispatch's backward (3), ops 12-15
    assert p.combine_backward_s == pytest.approx(1.0 + 1.0)
    assert p.experts_backward.compute_s == pytest.approx(1.0)
    assert p.dispatch_backward_s == pytest.approx(3.0)
    assert p.attention_backward.compute_s == pytest.approx(4.0)
    # serial: forward 2 + 2.5 + 1 + 1.5 + 2 = 9, backward 1 + 1 + 1 + 3 + 4 = 10
    assert p.serial_s == pytest.approx(19.0)
    assert p.combined_s() == pytest.approx(max(2, 2) + max(1, 2.5) + max(1, 3) + max(4, 3.5))
    # a contention halving the compute beside every all-to-all
    halved = layer_pairs(_Trace(events), collectives, comm, ops, lambda i: Contention(0.5, 0.0), [moe])[0]
    assert halved.attention_forward.slowdown == pytest.approx(2.0)


def test_the_hidden_all_to_alls_come_off_the_exposed_split():
    assert hidden_all_to_alls({"all_to_all": 5.0, "all_gather": 1.0}, 2.0) == {"all_to_all": 3.0, "all_gather": 1.0}
    assert hidden_all_to_alls({"all_gather": 1.0}, 2.0) == {"all_gather": 1.0}


_MOE = {"n_layer": 4, "dim": 2048, "n_heads": 16, "n_kv_heads": 4, "ffn_hidden": 512, "n_experts": 16, "top_k": 4,
        "moe_hidden": 1024, "vocab": 1024}


def _plan(execution: Execution, cache: RoleCache):
    request = ModelRequest("llama-7b", batch=execution.micro_batch * (execution.grad_accum if execution.pipeline > 1
                                                                       else 1),
                           seq_len=4096, overrides=_MOE)
    return evaluate(request, TraceOptions(dtype="bf16"), execution, load_gpu("h100-sxm"), load_cluster("dgx-h100"),
                    layers=4, cache=cache)


def test_the_overlap_hides_all_to_alls_between_micro_batches_and_no_more():
    """Without a pipeline the first forward and the last backward run alone: the plan with the
    overlap saves less than the all-to-alls it planned exposed, and more than nothing."""
    base = Execution(world=16, data="zero1", expert=16, micro_batch=1, grad_accum=4)
    cache = RoleCache()
    without = _plan(base, cache)
    overlapped = _plan(replace(base, expert_overlap=True), cache)
    exposed = without.split.exposed_communication_s["all_to_all"]
    assert 0 < without.step_s - overlapped.step_s <= exposed * 3 / 4
    assert overlapped.split.exposed_communication_s["all_to_all"] < exposed
    # one micro-batch: nothing to run beside
    single = replace(base, grad_accum=1)
    assert _plan(replace(single, expert_overlap=True), cache).step_s == pytest.approx(_plan(single, cache).step_s)


def test_an_interleaved_pipeline_runs_its_backwards_beside_forwards_with_one_more_in_flight():
    base = Execution(world=32, data="zero1", expert=16, pipeline=2, pipeline_schedule="interleaved-1f1b",
                     virtual_stages=2, micro_batch=1, grad_accum=4)
    cache = RoleCache()
    without = _plan(base, cache)
    overlapped = _plan(replace(base, expert_overlap=True), cache)
    assert overlapped.step_s < without.step_s
    # rank 0 holds one chunk's micro-batch more at once: a forward's beside the backward it runs
    # with (Megatron-Core's extra warm-up forward)
    assert overlapped.memory_bytes > without.memory_bytes
    # refused where Megatron-Core refuses it: a pipeline without virtual stages
    with pytest.raises(UsageError, match="virtual stages"):
        _plan(replace(base, pipeline_schedule="1f1b", virtual_stages=1, expert_overlap=True), cache)
