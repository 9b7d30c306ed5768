"""The search over micro-batch splits and checkpointing levels (search.plan._search), on a
memory model given in the test: which layouts it times and which it keeps. Checkpointing is
tried only for the larger micro-batch it makes room for; every accumulation down to
micro-batches of one is a candidate."""

from __future__ import annotations

import pytest

from nnperf.layout import Execution
from nnperf.search.plan import Planned
from nnperf.search.plan import search as plan_module
from nnperf.search.plan.layouts import layouts
from nnperf.search.plan.rank import RoleCache
from nnperf.search.plan.search import CHECKPOINTS, _search

#: The largest micro-batch each checkpointing level fits, by this test's memory model.
FITS = {None: 2, "selective-op": 4, "full": 16}


@pytest.fixture
def evaluated(monkeypatch):
    timed: list[Execution] = []

    def fake_evaluate(request, options, execution, gpu, cluster, **kwargs):
        timed.append(execution)
        return Planned(execution, fits=execution.micro_batch <= FITS[execution.checkpoint])

    monkeypatch.setattr(plan_module, "evaluate", fake_evaluate)
    return timed


def test_every_split_down_to_micro_batches_of_one():
    splits = {(e.micro_batch, e.grad_accum) for e in layouts(8, 8, 512)}
    assert splits == {(64 // a, a) for a in (1, 2, 4, 8, 16, 32, 64)}


def test_each_level_that_fits_a_larger_micro_batch_is_kept(evaluated):
    candidates = [e for e in layouts(8, 8, 512) if e.data == "fsdp"]
    results = _search(None, None, candidates, None, None, None, RoleCache())
    fitting = {(p.execution.checkpoint, p.execution.micro_batch) for p in results if p.fits}
    assert fitting == {(None, 2), ("selective-op", 4), ("full", 16)}
    # a level is not timed at micro-batches the level before it already fitted
    assert not any(e.checkpoint and e.micro_batch <= 2 for e in evaluated)
    assert not any(e.checkpoint == "full" and e.micro_batch <= 4 for e in evaluated)


def test_no_checkpointing_is_tried_when_the_whole_local_batch_fits(evaluated):
    candidates = [e for e in layouts(8, 8, 16) if e.data == "fsdp"]  # local batch 2: fits at once
    results = _search(None, None, candidates, None, None, None, RoleCache())
    assert [(p.execution.checkpoint, p.execution.micro_batch) for p in results if p.fits] == [(None, 2)]
    assert {e.checkpoint for e in evaluated} == {None}


def test_only_the_allowed_levels_are_timed(evaluated):
    """Checkpointing pinned to none and full: selective-op is never timed, and full still only
    for micro-batches larger than no checkpointing fitted."""
    candidates = [e for e in layouts(8, 8, 512) if e.data == "fsdp"]
    allowed = (CHECKPOINTS.index(None), CHECKPOINTS.index("full"))
    results = _search(None, None, candidates, None, None, None, RoleCache(), allowed=allowed)
    assert {(p.execution.checkpoint, p.execution.micro_batch) for p in results if p.fits} == {(None, 2), ("full", 16)}
    assert {e.checkpoint for e in evaluated} == {None, "full"}
    assert not any(e.checkpoint == "full" and e.micro_batch <= 2 for e in evaluated)


def test_other_engines_pipelines_are_searched_at_fsdps_best_pipeline(evaluated, monkeypatch):
    """Pipelines after the first pass (no pipeline): FSDP at every degree and schedule; DDP, ZeRO-1 and HSDP at
    the one where FSDP is fastest (here 4 stages interleaved, by this test's step times)."""
    from nnperf.hardware.catalog import load_gpu
    from nnperf.hardware.cluster import load_cluster
    from nnperf.request import ModelRequest
    from nnperf.search.plan import plan
    from nnperf.search.plan.results import TimeSplit
    from nnperf.trace.options import TraceOptions

    def step(execution):
        return 1.0 + (execution.pipeline != 4) + (execution.pipeline_schedule == "1f1b") + (execution.data != "fsdp")

    def fake_evaluate(request, options, execution, gpu, cluster, **kwargs):
        evaluated.append(execution)
        # compute well below every step: no pipeline is cut by a flat layout's compute
        return Planned(execution, step_s=step(execution), fits=True, split=TimeSplit(0.1, 0.0, 0.0, 0.0, {}, 0.0))

    monkeypatch.setattr(plan_module, "evaluate", fake_evaluate)
    monkeypatch.setenv("NNPERF_PLAN_WORKERS", "1")
    plan(ModelRequest("gpt2", seq_len=64, overrides={"n_layer": 8, "n_embd": 64, "n_head": 2, "vocab": 128}),
         TraceOptions(), load_gpu("h100"), 16, load_cluster("dgx-h100"), global_batch=64, tensor=[1],
         pipeline=[1, 2, 4], checkpoints=[None])
    piped = {(e.data, e.pipeline, e.pipeline_schedule) for e in evaluated if e.pipeline > 1}
    assert {(d, p, s) for d, p, s in piped if d == "fsdp"} == {
        ("fsdp", p, s) for p in (2, 4) for s in ("1f1b", "interleaved-1f1b")}
    assert {(p, s) for d, p, s in piped if d != "fsdp"} == {(4, "interleaved-1f1b")}
    assert {d for d, _, _ in piped} >= {"ddp", "zero1"}


@pytest.mark.slow
def test_a_search_traces_each_rank_role_once(monkeypatch):
    """Each pass's tasks start from the roles the passes before traced: FSDP's pipeline roles
    searched again beside the other engines, and the winner without sequence parallelism
    evaluated ahead, are not traced twice (the tasks run here one after the other, through the
    same hand-over of traced roles as forked workers)."""
    from nnperf.hardware.catalog import load_gpu
    from nnperf.hardware.cluster import load_cluster
    from nnperf.request import ModelRequest
    from nnperf.search.plan import plan
    from nnperf.search.plan import rank as rank_module
    from nnperf.trace.options import TraceOptions

    traced: list[tuple] = []
    real = rank_module.rank_cost

    def counted(request, options, execution, gpu, cluster, rank=0, prepare=None, units=None):
        traced.append((repr(request), options, execution, rank, prepare is None))
        return real(request, options, execution, gpu, cluster, rank, prepare, units)

    monkeypatch.setattr(rank_module, "rank_cost", counted)
    monkeypatch.setenv("NNPERF_PLAN_WORKERS", "1")
    # wide enough that the step is compute, not host: FSDP's pipelines then come within the
    # first pass's best (a host-bound tiny model has them bounded out untraced)
    wide = {"n_layer": 4, "n_embd": 4096, "n_head": 32, "vocab": 64, "n_positions": 2048}
    result = plan(ModelRequest("gpt2", seq_len=2048, overrides=wide),
                  TraceOptions(), load_gpu("h100"), 8, load_cluster("dgx-h100"), global_batch=16, tensor=[2],
                  pipeline=[1, 2], checkpoints=[None])
    assert {p.execution.data for p in result.ranked if p.execution.pipeline > 1} > {"fsdp"}  # a third pass ran
    assert not result.ranked[0].execution.sequence_parallel or any(
        not p.execution.sequence_parallel for p in result.ranked)  # the winner without SP is there
    assert len(traced) == len(set(traced)) == result.traces
