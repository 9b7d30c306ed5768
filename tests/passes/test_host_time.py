"""The host's time of an eager step from its parts (``passes.host_time``), checked by adding
the parts up by hand from the trace's own counts and the profile's constants."""

from __future__ import annotations

import dataclasses

import pytest

from nnperf.analysis import analyze
from nnperf.hardware import default_profile, load_gpu
from nnperf.passes.fusion import fused_groups
from nnperf.passes.host_time import HostCosts
from nnperf.passes.timing import simulate_step

GPU = load_gpu("h100")


def _profile(**changes):
    """Round numbers, so each expected sum is plain arithmetic; no optimizer step measured
    as a whole (each optimizer op priced like any other) unless ``changes`` give one."""
    base = default_profile(GPU)
    changes = {"host_optimizer_step_s": {}, "host_optimizer_param_s": {}, **changes}
    return dataclasses.replace(
        base, host_dispatch_s=10e-6, host_dispatch_by_kind_s={"gemm": 20e-6}, host_view_s=2e-6,
        host_python_call_s=1e-6, host_autograd_record_s=0.5e-6, host_view_autograd_s=0.25e-6,
        host_module_call_s=3e-6, host_module_hook_s=4e-6, host_autocast_op_s=0.0, host_backward_node_s=5e-6,
        host_backward_call_s=40e-6, host_zero_grad_param_s=0.1e-6, host_sync_s=0.0, host_in_context=1.5,
        kernel_overhead_s=0.0, host_dtensor_dispatch_s=0.0, host_dtensor_list_tensor_s=0.0, **changes)


def _expected(trace, counts, profile, optimizer_step: float | None = None, compiled: bool = False) -> float:
    """The parts added up event by event, independently of ``HostCosts``. ``compiled``: the
    blocks' ops as Inductor's wrapper issues them, each kernel one call from Python and a view
    nothing, a block's pointwise group one kernel, no module call of their own; each call of a
    block one autograd node in forward and one backward node, however its backward's ops
    interleave with the engine's."""
    category = {c.event.index: c.category for c in counts}
    fused_away = {i for group in fused_groups(trace, counts).values() for i in group.members[1:]}
    total, node, in_backward = 0.0, -1, False
    optimizer = [e for e in trace.events if e.phase == "optimizer"]
    for e in trace.events:
        in_block = compiled and e.block_call >= 0
        if optimizer_step is not None and e.phase == "optimizer":
            total += optimizer_step / len(optimizer)
        elif in_block:
            if not e.free and e.index not in fused_away:
                total += (20e-6 if category[e.index] == "gemm" else 10e-6) * 1.5
        elif e.free or e.name == "aten._local_scalar_dense":
            total += (2e-6 if e.python_call else 1e-6) + (0.25e-6 if e.records_grad else 0.0)
        else:
            per_kind = 20e-6 if category[e.index] == "gemm" else 10e-6
            total += (per_kind if e.python_call else per_kind - 1e-6) * 1.5 + (0.5e-6 if e.records_grad else 0.0)
        if not in_block:
            total += e.module_calls * 3e-6 + e.module_hooks * 4e-6
        if e.phase == "backward" and not in_backward:
            total += 40e-6
        in_backward = e.phase == "backward"
        if not in_block and e.backward_node >= 0 and e.backward_node != node:
            node = e.backward_node
            total += 5e-6
    if compiled:
        calls = {e.block_call for e in trace.events if e.block_call >= 0}
        forward = {e.block_call for e in trace.events if e.block_call >= 0 and e.phase == "forward"}
        backward = {e.block_call for e in trace.events if e.block_call >= 0 and e.phase == "backward"}
        assert forward == backward == calls
        total += len(calls) * (0.5e-6 + 5e-6)  # its autograd node recorded, its backward node run
    if optimizer:
        total += 0.1e-6 * len(trace.param_storages)
    return total


def test_an_inference_step_adds_ops_views_and_module_calls():
    analysis = analyze("mlp", batch=2, train=False)
    profile = _profile()
    step = simulate_step(analysis.trace, analysis.ops, GPU, profile)
    assert step.host_s == pytest.approx(_expected(analysis.trace, analysis.ops, profile), rel=1e-12)
    assert sum(e.module_calls for e in analysis.trace.events) > 0


def test_a_training_step_adds_autograd_the_engine_and_zero_grad():
    analysis = analyze("mlp", batch=2, optimizer="sgd-momentum")
    profile = _profile()
    step = simulate_step(analysis.trace, analysis.ops, GPU, profile)
    assert step.host_s == pytest.approx(_expected(analysis.trace, analysis.ops, profile), rel=1e-12)
    assert step.host_slices[-1].name == "zero_grad"


def test_a_measured_optimizer_step_replaces_its_ops_prices():
    analysis = analyze("mlp", batch=2, optimizer="adamw", optimizer_impl="fused")
    params = len(analysis.trace.param_storages)
    profile = _profile(host_optimizer_step_s={"adamw/fused": 30e-6}, host_optimizer_param_s={"adamw/fused": 2e-6})
    step = simulate_step(analysis.trace, analysis.ops, GPU, profile)
    expected = _expected(analysis.trace, analysis.ops, profile, optimizer_step=30e-6 + params * 2e-6)
    assert step.host_s == pytest.approx(expected, rel=1e-12)
    # another implementation has no measurement: its ops are priced one by one
    assert HostCosts.of(profile).optimizer("adamw", "foreach") is None
    assert HostCosts.of(profile).optimizer("adam", "fused").param_s == 2e-6  # Adam runs AdamW's code


def test_compiled_blocks_issue_their_kernels_as_inductors_wrapper_does():
    """torch.compile of each block (``pointwise="fused"`` with PyTorch's layers): a block's ops
    pay no module call, autograd node, autocast or DTensor dispatch of their own, its views
    nothing, and its backward is one node per call; the step outside the blocks is eager. The
    same trace priced with Transformer Engine's layers (eager modules) costs more."""
    analysis = analyze("gpt2", n_layer=2, seq_len=32, batch=2, optimizer="sgd", pointwise="fused")
    trace, profile = analysis.trace, _profile()
    assert any(e.block_call >= 0 for e in trace.events)
    step = simulate_step(trace, analysis.ops, GPU, profile)
    assert step.host_s == pytest.approx(_expected(trace, analysis.ops, profile, compiled=True), rel=1e-12)
    eager = dataclasses.replace(trace, config={**trace.config, "linear_engine": "transformer-engine"})
    assert simulate_step(eager, analysis.ops, GPU, profile).host_s > step.host_s
