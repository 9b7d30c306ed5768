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
