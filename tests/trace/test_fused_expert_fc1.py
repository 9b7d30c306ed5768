"""Megatron-Core's experts' gate and up projections as one layer (``trace.fused_expert_fc1``):
which traced GEMMs Transformer Engine's ``linear_fc1`` runs as one, and what the step then
times for them. A 1-block Llama with 4 experts (top 2) on fake tensors: 32 tokens, 64 routed
rows, 16 a expert, dim 32, expert hidden 16 (about a second a trace)."""

from __future__ import annotations

import pytest

from nnperf.hardware import default_profile, load_gpu
from nnperf.kernels.engines import TRANSFORMER_ENGINE
from nnperf.kernels.grouped_gemm import estimate_grouped_gemm
from nnperf.layout import Execution
from nnperf.passes.count import count_ops
from nnperf.passes.timing import simulate_step
from nnperf.trace.distributed import trace_rank
from nnperf.trace.options import TraceOptions

MOE = {"n_layer": 1, "dim": 32, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 48, "vocab": 101,
       "n_experts": 4, "top_k": 2, "moe_hidden": 16}
BATCH, SEQ = 2, 16
PER_EXPERT = BATCH * SEQ * MOE["top_k"] // MOE["n_experts"]  # routed rows an expert (uniform routing)


def _trace(execution: Execution):
    from nnperf.zoo import get_model

    return trace_rank(lambda: get_model("llama-7b").build(batch=BATCH, seq_len=SEQ, **MOE),
                      TraceOptions(optimizer="adamw", dtype="bf16"), execution, lambda model: [])


@pytest.fixture(scope="module")
def megatron():
    execution = Execution(world=2, data="zero1", micro_batch=BATCH)
    assert execution.megatron_layout
    return _trace(execution)


def _grouped(trace):
    return {e.index: e for e in trace.events if e.name == "aten._grouped_mm"}


def test_the_gate_and_up_projections_gemms_are_grouped_in_each_pass(megatron):
    """Forward: the two GEMMs over the routed rows (not the down projection's); weight
    gradient: the two reading those saved rows; input gradient: the two whose results one add
    sums, and that add."""
    trace = megatron.trace
    groups = {first: tuple(members) for first, members in trace.config["fused_linears"].items()}
    grouped = _grouped(trace)
    assert len(groups) == 3 and all(len(members) == 2 for members in groups.values())
    routed = {e.inputs[0].storage for e in grouped.values() if str(e.phase) == "forward"}
    assert len(routed) == 2  # the routed rows, the down projection's input
    kinds: set[str] = set()
    for members in groups.values():
        first, second = (grouped[i] for i in members)
        assert first.index < second.index and str(first.phase) == str(second.phase)
        if str(first.phase) == "forward":
            assert first.inputs[0] == second.inputs[0]  # one input, two weights
            kinds.add("forward")
        elif len(first.outputs[0].shape) == 3:
            assert first.inputs[1] == second.inputs[1]  # one saved input, two weight gradients
            kinds.add("grad_weight")
        else:
            kinds.add("grad_input")
    assert kinds == {"forward", "grad_weight", "grad_input"}
    (add,) = (trace.events[i] for i in trace.config["fused_sums"])
    dgrad = next(members for members in groups.values() if str(grouped[members[0]].phase) != "forward"
                 and len(grouped[members[0]].outputs[0].shape) == 2)
    assert {m.storage for m in add.inputs} == {grouped[i].outputs[0].storage for i in dgrad}


def test_torchtitans_layouts_keep_two_grouped_gemms():
    """torchtitan runs the traced layer itself: nothing grouped."""
    execution = Execution(world=2, data="fsdp", shard=2, micro_batch=BATCH)
    assert not execution.megatron_layout
    assert "fused_linears" not in _trace(execution).trace.config


def test_the_fused_layer_is_timed_as_one_gemm_an_expert(megatron):
    """The group's first GEMM runs each expert's GEMM at the fused width (gate and up: 2 x 16
    output features, where each member has 16): forward 16 x 32 x 32, weight gradient
    32 x 32 x 16, input gradient 16 x 32 x 32 (the contraction over both); the second GEMM and
    the add run nothing, and the GEMMs' FLOPs are the members' together."""
    gpu = load_gpu("h100-sxm")
    profile = default_profile(gpu)
    step = simulate_step(megatron.trace, count_ops(megatron.trace), gpu, profile)
    ops = {t.index: t for t in step.ops}
    config = megatron.trace.config
    dim, hidden = MOE["dim"], MOE["moe_hidden"]
    expected = {"forward": (PER_EXPERT, 2 * hidden, dim), "grad_weight": (2 * hidden, dim, PER_EXPERT),
                "grad_input": (PER_EXPERT, dim, 2 * hidden)}
    for first, members in config["fused_linears"].items():
        head, second = ops[first], ops[members[1]]
        role = head.count.gemms[0].role
        assert second.kernels == 0 and second.kernel_s == 0.0 and second.host_s == 0.0
        shapes = [expected[role]] * MOE["n_experts"]
        est = estimate_grouped_gemm(shapes, dtype="bf16", gpu=gpu, profile=profile,
                                    min_bytes=_fused_bytes(), engine=TRANSFORMER_ENGINE)
        assert head.kernels == MOE["n_experts"]
        assert head.kernel_s == pytest.approx(est.time_s, rel=1e-9)
        assert sum(g.gemm.flops for g in head.gemms) == pytest.approx(
            head.count.flops + second.count.flops, rel=1e-9)
    (add,) = config["fused_sums"]
    assert ops[add].kernels == 0 and ops[add].kernel_s == 0.0


def _fused_bytes() -> float:
    """The fused layer's bytes by hand, in bf16 (2 bytes) over the 64 routed rows: in every
    pass the rows of ``dim`` once (the forward's input, the weight gradient's saved input, the
    input gradient's one summed output), both members' weights or weight gradients (4 experts
    of dim x hidden each) and both members' rows of ``hidden`` (outputs or output gradients);
    the int32 offsets are not counted (a few bytes, ``passes.costs.grouped``)."""
    experts, dim, hidden = MOE["n_experts"], MOE["dim"], MOE["moe_hidden"]
    rows = experts * PER_EXPERT  # 64
    return 2 * (rows * dim + 2 * experts * dim * hidden + 2 * rows * hidden)


FP8_BLOCKS = 2  # --fp8 converts the linears of repeated blocks


@pytest.fixture(scope="module")
def fp8_step():
    """The MoE Llama's step under --fp8 in a Megatron layout: its trace config and timed ops."""
    from nnperf.zoo import get_model

    traced = trace_rank(
        lambda: get_model("llama-7b").build(batch=BATCH, seq_len=SEQ, **{**MOE, "n_layer": FP8_BLOCKS}),
        TraceOptions(optimizer="adamw", dtype="bf16", fp8=True), Execution(world=2, data="zero1", micro_batch=BATCH),
        lambda model: [])
    gpu = load_gpu("h100-sxm")
    step = simulate_step(traced.trace, count_ops(traced.trace), gpu, default_profile(gpu))
    return traced.trace.config, {t.index: t for t in step.ops}


def test_in_fp8_the_fused_layers_output_gradient_is_cast_once_an_expert(fp8_step):
    """Under --fp8 the fused input gradient casts the layer's output gradient (both members'
    rows of hidden features: their bytes, 2 + 2 read and 1 + 1 written an element) with one cast
    an expert (3 kernels), then runs its FP8 GEMMs over one-byte operands."""
    config, ops = fp8_step
    gpu = load_gpu("h100-sxm")
    profile = default_profile(gpu)
    experts, dim, hidden = MOE["n_experts"], MOE["dim"], MOE["moe_hidden"]
    pairs = [(ops[f], ops[m[1]]) for f, m in config["fused_linears"].items()
             if ops[f].count.gemms[0].role == "grad_input"]
    assert len(pairs) == FP8_BLOCKS
    head, second = pairs[0]
    operands = sum(float(t.count.event.args[0].numel + t.count.event.args[1].numel) for t in (head, second)) \
        + head.count.event.outputs[0].nbytes  # gradients and weights in FP8, one sum written
    est = estimate_grouped_gemm([(PER_EXPERT, dim, 2 * hidden)] * experts, dtype="fp8", gpu=gpu, profile=profile,
                                min_bytes=operands, engine=TRANSFORMER_ENGINE)
    cast_bytes = experts * PER_EXPERT * 2 * hidden * (2 + 2 + 1 + 1)
    cast_s = profile.memory_time(gpu.memory_bandwidth, cast_bytes) + 3 * experts * profile.kernel_overhead_s
    assert head.math == "fp8" and head.kernels == experts + 3 * experts and second.kernels == 0
    assert head.kernel_s == pytest.approx(est.time_s + cast_s, rel=1e-9)


def test_in_fp8_the_fused_forward_and_weight_gradient_read_one_byte_operands_once(fp8_step):
    """The fused forward reads the routed rows once and both members' weights, in FP8, and
    writes both members' outputs (bf16); it casts its input once an expert. The fused weight
    gradient reads both members' output gradients and the saved rows once, in FP8, writes both
    weight gradients, and casts nothing (the column-wise copies were made in forward). Bytes
    from the shapes: rows 64 x 32, each member's weights 4 x 32 x 16, outputs 64 x 16."""
    config, ops = fp8_step
    gpu = load_gpu("h100-sxm")
    profile = default_profile(gpu)
    experts, dim, hidden = MOE["n_experts"], MOE["dim"], MOE["moe_hidden"]
    rows = BATCH * SEQ * MOE["top_k"]
    weights = experts * dim * hidden  # one member's, elements
    heads = {ops[first].count.gemms[0].role: ops[first] for first in config["fused_linears"]}
    forward, weight_grad = heads["forward"], heads["grad_weight"]
    est = estimate_grouped_gemm([(PER_EXPERT, 2 * hidden, dim)] * experts, dtype="fp8", gpu=gpu, profile=profile,
                                min_bytes=rows * dim + 2 * weights + 2 * rows * hidden * 2, engine=TRANSFORMER_ENGINE)
    cast_s = profile.memory_time(gpu.memory_bandwidth, rows * dim * (2 + 2 + 1 + 1)) \
        + 3 * experts * profile.kernel_overhead_s
    assert forward.kernels == experts + 3 * experts
    assert forward.kernel_s == pytest.approx(est.time_s + cast_s, rel=1e-9)
    est = estimate_grouped_gemm([(2 * hidden, dim, PER_EXPERT)] * experts, dtype="fp8", gpu=gpu, profile=profile,
                                min_bytes=2 * rows * hidden + rows * dim + 2 * weights * 2, engine=TRANSFORMER_ENGINE)
    assert weight_grad.kernels == experts
    assert weight_grad.kernel_s == pytest.approx(est.time_s, rel=1e-9)
