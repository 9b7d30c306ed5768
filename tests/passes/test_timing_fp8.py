"""FP8 linears (``TraceOptions.fp8``): which layers convert, what their GEMMs and casts cost,
and the one-line refusals. Traces a 2-block Llama on fake tensors (about a second each)."""

from __future__ import annotations

import pytest

import nnperf
from nnperf.errors import UsageError
from nnperf.hardware import default_profile, load_gpu
from nnperf.kernels.engines import PYTORCH, TRANSFORMER_ENGINE
from nnperf.kernels.gemm import estimate_gemm
from nnperf.kernels.grouped_gemm import estimate_grouped_gemm
from nnperf.passes.costs import registry as cat

SMALL = {"n_layer": 2, "dim": 512, "n_heads": 8, "n_kv_heads": 4, "ffn_hidden": 1024, "vocab": 4096}
BATCH_TOKENS = 2 * 1024  # the fixture's batch x sequence
#: torchtitan's Llama block: attention (wq, wk, wv, wo) and SwiGLU feed-forward (w1, w2, w3)
BLOCK_LINEARS = ("attention.wq", "attention.wk", "attention.wv", "attention.wo",
                 "feed_forward.w1", "feed_forward.w2", "feed_forward.w3")


@pytest.fixture(scope="module")
def fp8_analysis():
    return nnperf.analyze("llama-7b", batch=2, seq_len=1024, amp="bf16", fp8=True, **SMALL)


def test_the_linears_inside_the_blocks_convert_and_the_head_does_not(fp8_analysis):
    expected = {f"layers.{i}.{name}" for i in range(SMALL["n_layer"]) for name in BLOCK_LINEARS}
    assert set(fp8_analysis.trace.config["fp8_linears"]) == expected
    assert any("FP8" in note for note in fp8_analysis.trace.config["assumptions"])


def test_a_mixture_of_experts_router_stays_16_bit():
    """A 2-block Llama with 16 experts (top 2) in place of its SwiGLU: the attention's four
    linears convert, the router (``moe.gate``, 512 -> 16: aligned for FP8) does not, as
    neither Megatron-Core (its router outside Transformer Engine) nor torchtitan
    (``filter_fqns = ["output", "router.gate"]``) runs it in FP8; its GEMMs stay 16-bit."""
    options = {**SMALL, "n_experts": 16, "top_k": 2, "moe_hidden": 256}
    analysis = nnperf.analyze("llama-7b", batch=2, seq_len=1024, amp="bf16", fp8=True, **options)
    attention = ("attention.wq", "attention.wk", "attention.wv", "attention.wo")
    expected = {f"layers.{i}.{name}" for i in range(SMALL["n_layer"]) for name in attention}
    assert set(analysis.trace.config["fp8_linears"]) == expected
    prediction = nnperf.predict(analysis, load_gpu("h100-sxm"))
    router = [t for t in prediction.step.ops if t.category == cat.GEMM and t.count.event.module.endswith("moe.gate")]
    assert router and all(t.math == "bf16" for t in router)


def test_transformer_engines_experts_run_in_fp8_with_a_cast_per_expert():
    """Megatron-LM's layouts run the experts as Transformer Engine's GroupedLinear, in FP8 under
    --fp8 (``trace.config``: ``linear_engine``, ``fp8_experts``): each grouped GEMM is
    TE's GEMMs per expert at the FP8 rate reading one-byte operands, after each expert's 16-bit
    operand is cast (amax, scale, cast: 3 kernels; 2 + 2 bytes read, 1 + 1 written an element);
    the weight gradient reads the column-wise copies and casts nothing."""
    options = {**SMALL, "n_experts": 16, "top_k": 2, "moe_hidden": 256}
    analysis = nnperf.analyze("llama-7b", batch=2, seq_len=1024, amp="bf16", fp8=True, **options)
    gpu = load_gpu("h100-sxm")
    profile = default_profile(gpu)
    bf16 = [t for t in nnperf.predict(analysis, gpu).step.ops if t.op == "aten._grouped_mm"]
    analysis.trace.config.update(linear_engine=TRANSFORMER_ENGINE, fp8_experts=True)
    grouped = [t for t in nnperf.predict(analysis, gpu).step.ops if t.op == "aten._grouped_mm"]
    assert grouped and len(grouped) == len(bf16) and all(t.math == "bf16" for t in bf16)
    roles = set()
    for t in grouped:
        a, b = t.count.event.args[0], t.count.event.args[1]
        out = t.count.event.outputs[0]
        gemms = estimate_grouped_gemm([(g.m, g.n, g.k) for g in t.count.gemms], dtype="fp8", gpu=gpu,
                                      profile=profile, min_bytes=a.numel + b.numel + out.nbytes,
                                      engine=TRANSFORMER_ENGINE)
        casts = [g for g in t.count.gemms if g.role != "grad_weight"]
        cast_s = profile.memory_time(gpu.memory_bandwidth, sum(g.m * g.k * (2 + 2 + 1 + 1) for g in casts)) \
            + 3 * len(casts) * profile.kernel_overhead_s
        assert t.math == "fp8" and t.kernels == len(t.count.gemms) + 3 * len(casts)
        assert t.kernel_s == pytest.approx(gemms.time_s + cast_s, rel=1e-9)
        roles |= {g.role for g in t.count.gemms}
    assert {"grad_input", "grad_weight"} <= roles  # forward (role unset) and both gradients seen
    # a share of 0 (the fused gate-up layer's second GEMM, ``trace.fp8_casts``) casts nothing
    first = grouped[0]
    analysis.trace.config["fp8_cast_shares"] = {first.count.event.index: 0.0}
    shared = next(t for t in nnperf.predict(analysis, gpu).step.ops if t.index == first.index)
    assert shared.kernels == len(first.count.gemms)
    assert shared.kernel_s == pytest.approx(first.kernel_s - (first.kernels - len(first.count.gemms))
                                            * profile.kernel_overhead_s - _cast_memory(first, gpu, profile))


@pytest.mark.parametrize("engine, cast_kernels", [(PYTORCH, 2), (TRANSFORMER_ENGINE, 3)])
def test_a_converted_gemm_costs_its_fp8_gemm_and_the_casts_of_its_16_bit_operand(fp8_analysis, engine,
                                                                                   cast_kernels):
    """torchao's cast is an amax reduction and the scaled cast; Transformer Engine's
    (Megatron-LM's layouts) computes the scale in a kernel between them."""
    gpu = load_gpu("h100-sxm")
    profile = default_profile(gpu)
    config = fp8_analysis.trace.config
    config["linear_engine"] = engine
    try:
        prediction = nnperf.predict(fp8_analysis, gpu)
    finally:
        del config["linear_engine"]
    converted = set(fp8_analysis.trace.config["fp8_linears"])
    checked = {"forward": 0, "grad_input": 0, "grad_weight": 0}
    for t in prediction.step.ops:
        if t.category != cat.GEMM or t.count.event.module not in converted:
            continue
        (g,) = t.count.gemms
        gemm = estimate_gemm(g.m, g.n, g.k, batch=g.batch, dtype="fp8", gpu=gpu, profile=profile)
        if g.role == "grad_weight":  # reads the column-wise copies made for it: nothing to cast
            cast_s, kernels = 0.0, 1
        else:
            # the operand it brings (tokens x contraction): an amax read and a cast read in 16
            # bits, row-wise and column-wise FP8 writes
            elements = g.m * g.k * g.batch
            cast_s = profile.memory_time(gpu.memory_bandwidth, elements * (2 + 2 + 1 + 1)) \
                + cast_kernels * profile.kernel_overhead_s
            kernels = 1 + cast_kernels
        assert t.math == "fp8"
        assert t.kernels == kernels
        assert t.kernel_s == pytest.approx(gemm.time_s + cast_s, rel=1e-9)
        checked[g.role] += 1
    layers = SMALL["n_layer"] * len(BLOCK_LINEARS)
    assert checked == {"forward": layers, "grad_input": layers, "grad_weight": layers}
    head = [t for t in prediction.step.ops if t.category == cat.GEMM and t.count.event.module == "output"]
    assert head and all(t.math == "bf16" for t in head)


def test_a_layer_that_saves_its_16_bit_input_casts_it_again_in_backward(fp8_analysis):
    """Megatron-Core's output projection saves the attention's output as it is
    (``trace.fp8_saved_inputs``): its forward cast writes row-wise FP8 only (2 + 2 read, 1
    written an element), and its weight-gradient GEMM casts the saved input again, column-wise
    (the same bytes, Transformer Engine's 3 kernels), where otherwise it casts nothing."""
    gpu = load_gpu("h100-sxm")
    profile = default_profile(gpu)
    config = fp8_analysis.trace.config
    wo = [t for t in nnperf.predict(fp8_analysis, gpu).step.ops
          if t.category == cat.GEMM and t.count.event.module == "layers.0.attention.wo"]
    forward = next(t for t in wo if t.count.gemms[0].role == "forward")
    weight = next(t for t in wo if t.count.gemms[0].role == "grad_weight")
    elements = BATCH_TOKENS * SMALL["dim"]  # wo's input: every token's attention output
    config.update(linear_engine=TRANSFORMER_ENGINE, fp8_rowwise_casts=frozenset({forward.index}),
                  fp8_recast_inputs={weight.index: elements})
    try:
        ops = {t.index: t for t in nnperf.predict(fp8_analysis, gpu).step.ops}
    finally:
        for key in ("linear_engine", "fp8_rowwise_casts", "fp8_recast_inputs"):
            del config[key]
    (g,) = forward.count.gemms
    assert g.m * g.k == elements
    row_wise = profile.memory_time(gpu.memory_bandwidth, elements * (2 + 2 + 1)) + 3 * profile.kernel_overhead_s
    assert ops[forward.index].kernel_s == pytest.approx(estimate_gemm(
        g.m, g.n, g.k, dtype="fp8", gpu=gpu, profile=profile).time_s + row_wise, rel=1e-9)
    (g,) = weight.count.gemms
    assert ops[weight.index].kernels == 1 + 3
    assert ops[weight.index].kernel_s == pytest.approx(estimate_gemm(
        g.m, g.n, g.k, dtype="fp8", gpu=gpu, profile=profile).time_s + row_wise, rel=1e-9)


def test_fp8_shortens_the_block_gemms_of_a_large_layer():
    shape = {**SMALL, "dim": 4096, "n_heads": 32, "n_kv_heads": 8, "ffn_hidden": 14336}
    gpu = load_gpu("h100-sxm")

    def block_gemm_s(fp8: bool) -> float:
        analysis = nnperf.analyze("llama-7b", batch=1, seq_len=4096, amp="bf16", fp8=fp8, **shape)
        step = nnperf.predict(analysis, gpu).step
        return sum(t.kernel_s for t in step.ops if t.category == cat.GEMM
                   and t.count.event.module.startswith("layers.") and "attention.sdpa" not in t.count.event.module)

    # twice the tensor rate, less the casts: faster, but not twice as fast
    bf16, fp8 = block_gemm_s(False), block_gemm_s(True)
    assert 0.5 * bf16 < fp8 < 0.8 * bf16


def test_fp8_needs_a_16_bit_step():
    with pytest.raises(UsageError, match="--amp bf16"):
        nnperf.analyze("llama-7b", batch=1, seq_len=128, fp8=True, **SMALL)


def test_fp8_on_a_gpu_without_fp8_tensor_cores_is_refused(fp8_analysis):
    with pytest.raises(UsageError, match="no FP8 tensor cores"):
        nnperf.predict(fp8_analysis, "a100-80gb-sxm")


def test_fp8_on_a_model_without_repeated_blocks_is_refused():
    with pytest.raises(UsageError, match="repeated blocks"):
        nnperf.analyze("mlp", batch=16, amp="bf16", fp8=True)


def _cast_memory(t, gpu, profile) -> float:
    """The cast bytes of a grouped GEMM's experts (2 + 2 read, 1 + 1 written an element) timed."""
    casts = [g for g in t.count.gemms if g.role != "grad_weight"]
    return profile.memory_time(gpu.memory_bandwidth, sum(g.m * g.k * (2 + 2 + 1 + 1) for g in casts))
