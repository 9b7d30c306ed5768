"""Functional collectives' waits (``_c10d_functional.wait_tensor``, what every DTensor
redistribution returns through) launch no kernel: on a traced tensor-parallel rank each is a
host op of no device time, one per functional collective, and the collectives stay on the
communication stream."""

from __future__ import annotations

from nnperf.analysis import Analysis
from nnperf.hardware.catalog import load_gpu
from nnperf.layout import Execution
from nnperf.prediction import predict_analysis
from nnperf.trace.blocks import repeated_blocks
from nnperf.trace.distributed import trace_rank
from nnperf.trace.options import TraceOptions
from nnperf.vocab import Category
from nnperf.zoo import get_model


def test_waits_of_functional_collectives_cost_no_device_time():
    def build():
        return get_model("gpt2").build(batch=2, seq_len=16, n_layer=2, n_embd=64, n_head=4, vocab=64,
                                       n_positions=16)

    execution = Execution(world=2, tensor=2, sequence_parallel=True)
    traced = trace_rank(build, TraceOptions(), execution, repeated_blocks)
    analysis = Analysis.from_trace("gpt2", TraceOptions(), traced.trace, traced.workload)
    ops = predict_analysis(analysis, load_gpu("h100-sxm")).step.ops
    waits = [t for t in ops if t.count.event.name == "_c10d_functional.wait_tensor"]
    functional = [t for t in ops if t.count.event.name.startswith("_c10d_functional.")
                  and t.category == Category.COMMUNICATION]
    assert waits and len(waits) == len(functional)
    assert all(t.category == Category.HOST and t.kernels == 0 and t.kernel_s == 0 for t in waits)
    assert all(t.count.covered for t in waits)
