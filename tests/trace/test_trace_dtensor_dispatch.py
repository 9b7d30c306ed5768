"""DTensor's host cost in the trace: each DTensor dispatch is counted on the op recorded after
it, with the tensors of its list arguments, and the time model charges the profile's measured
cost for them on the host. FSDP2 runs forward and backward on plain unsharded parameters
(its DTensors are the sharded ones), so only its optimizer step dispatches DTensors; tensor
parallelism runs every split op on DTensors."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from nnperf.analysis import Analysis
from nnperf.hardware import default_profile
from nnperf.hardware.catalog import load_gpu
from nnperf.layout import Execution
from nnperf.passes.timing import simulate_step
from nnperf.trace.blocks import repeated_blocks
from nnperf.trace.distributed import trace_rank
from nnperf.trace.options import TraceOptions
from nnperf.zoo import get_model


def _build():
    return get_model("llama-7b").build(batch=2, seq_len=16, n_layer=2, dim=64, n_heads=4, n_kv_heads=2,
                                       ffn_hidden=96, vocab=64)


def _analysis(execution: Execution) -> Analysis:
    traced = trace_rank(_build, TraceOptions(), execution, repeated_blocks)
    return Analysis.from_trace("llama-7b", TraceOptions(), traced.trace, traced.workload)


def _dispatches(analysis: Analysis) -> dict[str, int]:
    out = {"forward": 0, "backward": 0, "optimizer": 0}
    for e in analysis.trace.events:
        out[e.phase] += e.subclass_dispatches
    return out


def test_fsdp_dispatches_dtensors_in_its_optimizer_step_only():
    analysis = _analysis(Execution(world=2, data="fsdp", shard=2))
    dispatches = _dispatches(analysis)
    assert dispatches["forward"] == dispatches["backward"] == 0
    assert dispatches["optimizer"] > 0
    # foreach AdamW over the sharded parameters: lists of every parameter, three of them in
    # _foreach_addcdiv_(params, exp_avgs, denominators)
    params = len(analysis.trace.param_storages)
    lists = [e.subclass_list_tensors for e in analysis.trace.events if e.subclass_list_tensors]
    assert lists and all(n % (params - 1) == 0 for n in lists)
    assert max(lists) == 3 * (params - 1)


def test_tensor_parallel_ops_carry_their_dtensor_host_time():
    analysis = _analysis(Execution(world=2, data="fsdp", shard=1, tensor=2, sequence_parallel=True))
    dispatches = _dispatches(analysis)
    assert dispatches["forward"] > 0 and dispatches["backward"] > dispatches["forward"]
    gpu = load_gpu("h100")
    base = default_profile(gpu).replace(host_dtensor_dispatch_s=0.0, host_dtensor_list_tensor_s=0.0)
    charged = base.replace(host_dtensor_dispatch_s=1e-4, host_dtensor_list_tensor_s=1e-6)
    without = simulate_step(analysis.trace, analysis.ops, gpu, base)
    with_ = simulate_step(analysis.trace, analysis.ops, gpu, charged)
    events = analysis.trace.events
    expected = 1e-4 * sum(e.subclass_dispatches for e in events) + 1e-6 * sum(e.subclass_list_tensors for e in events)
    assert with_.host_s - without.host_s == pytest.approx(expected)


@pytest.mark.process
def test_the_dtensor_benchmark_runs_and_counts_its_dispatches():
    """In a process of its own: it sets up its own fake world, which a trace's would be. What it
    measures (a difference of two timings, which a busy machine can make negative) is
    ``benchmarks/dtensor_dispatch.py``'s to show; here, that it runs and what it counted."""
    code = ("import json; from nnperf.measure.calibration.dtensor_host import dtensor_overheads; "
            "print(json.dumps(dtensor_overheads(repeats=2, steps=3)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    assert measured["dispatches"] > 100  # two tensor-parallel Llama blocks, forward and backward
    assert measured["dispatch_s"]["n"] == measured["list_tensor_s"]["n"] == 2
    assert all(math.isfinite(measured[k][q]) for k in ("dispatch_s", "list_tensor_s") for q in ("median", "p10", "p90"))
