"""A search's pruned pipeline (its first stage alone does not fit) against the same layout
composed from all its stage roles: the bound is at most the layout's memory, and a layout that
fits is evaluated as without pruning."""

from __future__ import annotations

import pytest

from nnperf.hardware.catalog import load_gpu
from nnperf.hardware.cluster import load_cluster
from nnperf.request import ModelRequest
from nnperf.search.plan import evaluate
from nnperf.search.plan_rank import RoleCache
from nnperf.trace.distributed import Execution
from nnperf.trace.options import TraceOptions

LLAMA = {"dim": 128, "n_heads": 4, "ffn_hidden": 256, "vocab": 512, "n_layer": 16}
GPU, CLUSTER = load_gpu("h100"), load_cluster("dgx-h100")
OPTIONS = TraceOptions(amp="bf16")
REQUEST = ModelRequest("llama-7b", batch=1, seq_len=64, overrides=LLAMA)


def _pipeline(schedule: str, virtual: int) -> Execution:
    return Execution(world=8, data="fsdp", shard=2, pipeline=4, pipeline_schedule=schedule, virtual_stages=virtual,
                     micro_batch=1, grad_accum=4, reshard_after_forward=False)


@pytest.mark.parametrize(("schedule", "virtual"), [("1f1b", 1), ("interleaved-1f1b", 2)])
def test_a_pruned_pipeline_is_a_lower_bound_from_one_role(schedule, virtual):
    execution = _pipeline(schedule, virtual)
    whole = RoleCache()
    exact = evaluate(REQUEST, OPTIONS, execution, GPU, CLUSTER, layers=16, cache=whole)
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
    plain = evaluate(REQUEST, OPTIONS, execution, GPU, CLUSTER, layers=16, cache=RoleCache())
    searched = evaluate(REQUEST, OPTIONS, execution, GPU, CLUSTER, layers=16, cache=RoleCache(), prune=True)
    assert plain.fits and not searched.memory_bound
    assert searched.to_json() == plain.to_json()


@pytest.mark.parametrize(("schedule", "virtual"), [("1f1b", 1), ("interleaved-1f1b", 2), ("gpipe", 1)])
def test_a_pipeline_slower_than_the_best_is_cut_at_a_lower_bound_of_its_step(schedule, virtual):
    """Rank 0's own work (its first stage's forward and backward of each of the 4 micro-batches,
    its head and tail) bounds the replayed step from below; a search whose best so far is
    faster than that bound traces the first stage's role only."""
    execution = _pipeline(schedule, virtual)
    exact = evaluate(REQUEST, OPTIONS, execution, GPU, CLUSTER, layers=16, cache=RoleCache())
    first = RoleCache()
    cut = evaluate(REQUEST, OPTIONS, execution, GPU, CLUSTER, layers=16, cache=first, prune=True, slower_than=1e-9)
    assert cut.time_bound and first.traces == 1
    assert 0 < cut.step_s <= exact.step_s
    assert cut.memory_bound and cut.memory_bytes <= exact.memory_bytes
    kept = evaluate(REQUEST, OPTIONS, execution, GPU, CLUSTER, layers=16, cache=RoleCache(), prune=True,
                    slower_than=exact.step_s * 2)
    assert not kept.time_bound and kept.to_json() == exact.to_json()
