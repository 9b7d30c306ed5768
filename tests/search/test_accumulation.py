"""Gradient accumulation on a device-bound step: each further micro-batch adds the device's
forward and backward, the optimizer and clipping run once. The reference is the step's own
kernel times summed by the test (not the timeline position ``once_span`` reads)."""

from __future__ import annotations

import pytest

from nnperf.analysis import analyze_request
from nnperf.hardware.catalog import load_gpu
from nnperf.hardware.cluster import load_cluster
from nnperf.layout import Execution
from nnperf.prediction import predict_analysis
from nnperf.request import ModelRequest
from nnperf.search.plan import evaluate
from nnperf.trace.options import TraceOptions
from nnperf.trace.step import once_per_step

GPU, CLUSTER = load_gpu("a100-80gb-sxm"), load_cluster("dgx-a100")
OPTIONS = TraceOptions(amp="bf16", clip_grad_norm=1.0)
WIDE = {"dim": 1024, "n_heads": 8, "ffn_hidden": 2816, "vocab": 512, "n_layer": 2}


def test_a_device_bound_step_repeats_its_micro_batch_and_runs_the_optimizer_once():
    request = ModelRequest("llama-7b", batch=8, seq_len=2048, overrides=WIDE)
    step = predict_analysis(analyze_request(request, OPTIONS), GPU).step
    kernels = sum(t.kernel_s for t in step.ops)
    assert step.bound != "host" and step.step_s == pytest.approx(kernels, rel=0.01)  # no idle device
    once = sum(t.kernel_s for t in step.ops if once_per_step(t.count.event))
    assert 0 < once < 0.1 * kernels
    for accum in (1, 4):
        planned = evaluate(request, OPTIONS, Execution(world=1, micro_batch=8, grad_accum=accum), GPU, CLUSTER)
        assert planned.step_s == pytest.approx(accum * (kernels - once) + once, rel=0.01)


def test_one_split_rule_for_plan_and_advise():
    """A global batch is ranks x micro-batch x steps exactly: every micro-batch divides the
    rank's share; an uneven share is refused by both commands with the nearest batches."""
    from nnperf.errors import UsageError
    from nnperf.search.accumulation import BatchSplit, local_batch, micro_batches
    from nnperf.search.advise.batch import accumulation_micro_batches
    from nnperf.search.plan.layouts import layouts

    assert micro_batches(1000) == [1, 2, 4, 5, 8, 10, 20, 25, 40, 50, 100, 125, 200, 250, 500, 1000]
    assert micro_batches(1000, largest=70) == [1, 2, 4, 5, 8, 10, 20, 25, 40, 50]
    assert accumulation_micro_batches(7, 64) == [1, 7]  # a micro-batch of 7 fits: one step
    # plan on one GPU splits the same way advise does
    assert sorted((e.micro_batch, e.grad_accum) for e in layouts(1, 8, 1000)) == [
        (m, 1000 // m) for m in micro_batches(1000)]
    assert BatchSplit.of(1000, 1, 50) == BatchSplit(1000, 1, 50, 20)
    with pytest.raises(ValueError):
        BatchSplit(1000, 1, 70, 15)  # 1050 samples: the split advise used to print
    with pytest.raises(UsageError, match="--global-batch 7 does not divide over 2 data-parallel ranks; "
                                         "nearest global batches that do: 6 or 8"):
        local_batch(7, 2)
    with pytest.raises(UsageError, match="nearest global batches that do: 6 or 8; or GPU counts"):
        layouts(2, 8, 7)
