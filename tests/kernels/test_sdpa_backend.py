"""SDPA's backend on a CUDA GPU (``kernels.attention``), one test per rule of PyTorch's
``select_sdp_backend`` (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp), and the math
fallback's time in a prediction."""

from __future__ import annotations

from dataclasses import replace

import pytest

from nnperf.analysis import analyze
from nnperf.hardware import load_gpu
from nnperf.kernels.attention import (
    CUDNN,
    EFFICIENT,
    FLASH,
    MATH,
    SdpaCall,
    gemm_alignment,
    select_backend,
)
from nnperf.kernels.engines import TRANSFORMER_ENGINE
from nnperf.prediction import predict

H100, A100, A10, V100, T4, P100, K80, MI300X = (
    load_gpu(n) for n in ("h100", "a100", "a10", "v100", "t4", "p100", "k80", "mi300x"))


def call(**kw) -> SdpaCall:
    base = dict(dtype="bf16", batch=2, heads_q=8, heads_kv=8, q_len=256, kv_len=256, head_dim=64,
                head_dim_k=64, head_dim_v=64, causal=True, requires_grad=True)
    base.update(kw)
    if "head_dim" in kw and "head_dim_k" not in kw:
        base["head_dim_k"] = base["head_dim_v"] = kw["head_dim"]
    return SdpaCall(**base)


def test_flash_first_on_ampere_and_later():
    assert select_backend(call(), A100) == FLASH
    assert select_backend(call(dtype="fp16"), H100) == FLASH


def test_an_explicit_mask_rules_out_flash():  # check_for_attn_mask
    assert select_backend(call(has_mask=True), A100) == EFFICIENT


def test_flash_head_dim_at_most_256():  # check_head_dim_size_flash
    assert select_backend(call(head_dim=320), A100) == EFFICIENT
    assert select_backend(call(head_dim=100), A100) == FLASH  # flash has no alignment rule


def test_flash_needs_sm80():  # check_flash_attention_hardware_support
    assert select_backend(call(dtype="fp16"), V100) == EFFICIENT
    assert select_backend(call(dtype="fp16"), T4) == EFFICIENT
    assert select_backend(call(dtype="fp16"), P100) == EFFICIENT  # sm60: efficient from sm50


def test_nothing_fused_below_sm50_or_off_cuda():
    assert select_backend(call(dtype="fp32"), K80) == MATH  # sm37
    assert select_backend(call(), MI300X) == MATH  # ROCm's aotriton kernels are not modelled


def test_flash_training_head_dim_limits_on_sm86_89():
    # check_requires_grad_and_head_dim_gt192_constraints_on_sm86_89_or_120
    assert select_backend(call(head_dim=200), A10) == EFFICIENT
    assert select_backend(call(head_dim=200, requires_grad=False), A10) == FLASH
    assert select_backend(call(head_dim=240), A10) == FLASH  # > 224 without dropout
    assert select_backend(call(head_dim=240, dropout=0.1), A10) == EFFICIENT
    assert select_backend(call(head_dim=200), A100) == FLASH  # sm80 has no such limit


def test_flash_causal_needs_square_lengths():  # check_flash_causal_non_square_seqlens
    assert select_backend(call(q_len=1, kv_len=256), A100) == EFFICIENT
    assert select_backend(call(q_len=1, kv_len=256, causal=False), A100) == FLASH


def test_dtypes():  # check_dtypes_flash_attention, mem-efficient's dtype lists
    assert select_backend(call(dtype="fp32"), A100) == EFFICIENT
    assert select_backend(call(dtype="bf16"), T4) == MATH  # bf16 efficient needs sm80
    assert select_backend(call(dtype="fp64"), A100) == MATH


def test_efficient_alignment():  # check_head_dim_size_mem_efficient, minimum_gemm_alignment
    assert [gemm_alignment(call(dtype=d), g) for d, g in
            (("fp16", V100), ("fp32", V100), ("fp16", A100), ("fp32", A100), ("fp32", P100))] == [8, 1, 8, 4, 1]
    assert select_backend(call(dtype="fp16", head_dim=100), V100) == MATH  # 100 % 8
    assert select_backend(call(dtype="fp32", head_dim=100), V100) == EFFICIENT
    assert select_backend(call(dtype="fp32", head_dim=102), A100) == MATH  # 102 % 4


def test_grouped_query_heads_need_enable_gqa():  # check_batch_size_and_num_heads_dense
    assert select_backend(call(heads_kv=2, enable_gqa=True), A100) == FLASH
    assert select_backend(call(heads_kv=2), A100) == MATH


def test_cudnn_only_when_preferred_and_eligible():
    # [B, H, S, D] views of [B, S, H, D]: what q = linear(x).view(B, S, H, D).transpose(1, 2) is
    s = (256 * 8 * 64, 64, 8 * 64, 1)
    projected = call(strides=(s, s, s))
    assert select_backend(projected, H100) == FLASH  # default order: cuDNN after math
    assert select_backend(projected, H100, cudnn_runtime=91600) == CUDNN  # check_prefer_cudnn_attention
    assert select_backend(projected, A100, cudnn_runtime=91600) == FLASH  # only sm 9.x / 10.x
    contiguous = replace(projected, strides=((8 * 256 * 64, 256 * 64, 64, 1),) * 3)
    assert select_backend(contiguous, H100, cudnn_runtime=91600) == FLASH  # check_cudnn_layout
    assert select_backend(replace(projected, dropout=0.1), H100, cudnn_runtime=91600) == FLASH  # 1/16 steps
    assert select_backend(replace(projected, dropout=0.125), H100, cudnn_runtime=91600) == CUDNN


def test_transformer_engine_gives_cudnn_the_calls_its_own_filter_allows():
    """Megatron-LM's layouts attend through Transformer Engine, whose filter
    (nvte_get_fused_attn_backend) decides, not PyTorch's: latent attention's 192/128 heads
    (q built by a concatenation: no [B, S, H, D] view) and Nemotron-4's 192 run cuDNN on Hopper,
    which PyTorch's checks refuse; not on Ampere (at most 128 there), and not without --sdpa
    cudnn (the engine's flash kernels then, timed as PyTorch's)."""
    latent = call(head_dim=192, head_dim_k=192, head_dim_v=128, heads_q=64, heads_kv=64, q_len=4096, kv_len=4096,
                  strides=((64 * 4096 * 192, 4096 * 192, 192, 1),) * 3)
    assert select_backend(latent, H100, cudnn_first=True) == EFFICIENT  # PyTorch: no flash, no cuDNN
    assert select_backend(latent, H100, cudnn_first=True, engine=TRANSFORMER_ENGINE) == CUDNN
    assert select_backend(latent, A100, cudnn_first=True, engine=TRANSFORMER_ENGINE) == EFFICIENT
    assert select_backend(latent, H100, engine=TRANSFORMER_ENGINE) == EFFICIENT
    wide = call(head_dim=192)
    assert select_backend(wide, H100, cudnn_first=True) == FLASH
    assert select_backend(wide, H100, cudnn_first=True, engine=TRANSFORMER_ENGINE) == CUDNN
    assert select_backend(call(head_dim=264), H100, cudnn_first=True, engine=TRANSFORMER_ENGINE) != CUDNN
    assert select_backend(call(dtype="fp32"), H100, cudnn_first=True, engine=TRANSFORMER_ENGINE) != CUDNN


def test_prediction_times_the_math_fallback_as_its_kernels():
    """gpt2 in fp32 on a K80 (sm37): SDPA runs the math backend, two batched GEMMs and the
    scale, causal-mask, softmax and dropout (gpt2's attention dropout 0.1) passes forward;
    four GEMMs and the dropout, softmax and scale backward."""
    a = analyze("gpt2", batch=2, seq_len=64, n_layer=1, n_embd=64, n_head=4, vocab=97)
    p = predict(a, "k80")
    fwd, bwd = (next(t for t in p.step.ops if t.op == op)
                for op in ("nnperf.attention", "nnperf.attention_backward"))
    assert (fwd.backend, fwd.kernels, bwd.backend, bwd.kernels) == (MATH, 6, MATH, 7)
    h100 = predict(a, "h100")
    assert {t.backend for t in h100.step.ops if t.category == "attention"} == {EFFICIENT}
    assert {t.math for t in h100.step.ops if t.category == "attention"} == {"3xtf32"}


@pytest.mark.parametrize("amp, gpu, backend", [("bf16", "h100", FLASH), ("fp16", "t4", EFFICIENT)])
def test_prediction_reports_the_backend(amp, gpu, backend):
    a = analyze("gpt2", batch=2, seq_len=64, n_layer=1, n_embd=64, n_head=4, vocab=97, amp=amp)
    assert {t.backend for t in predict(a, gpu).step.ops if t.category == "attention"} == {backend}


def test_the_efficient_kernel_runs_at_its_share_of_flash():
    """The memory-efficient kernel computes at ``efficient_attention_forward_scale`` /
    ``_backward_scale`` of the fraction flash reaches in that pass (the FlashAttention-2 paper's
    cutlass bars: about half, both passes): on a T4 (no flash below sm80) fp16 attention of 1024
    tokens is compute bound, so its modelled compute time is the executed FLOPs over peak x
    fraction x that pass's scale."""
    from nnperf.hardware.profile import default_profile

    a = analyze("gpt2", batch=4, seq_len=1024, n_layer=1, n_embd=512, n_head=8, vocab=97, amp="fp16")
    base = default_profile(T4)
    assert base.efficient_attention_forward_scale == base.efficient_attention_backward_scale == 0.5
    for forward, backward in ((0.5, 0.5), (0.25, 0.4)):
        p = predict(a, T4, profile=base.replace(efficient_attention_forward_scale=forward,
                                                efficient_attention_backward_scale=backward))
        for t in (t for t in p.step.ops if t.category == "attention"):
            assert t.backend == EFFICIENT
            in_backward = t.op.endswith("_backward")
            fraction = base.attention_backward_fraction if in_backward else base.attention_forward_fraction
            executed = t.count.flops + t.count.info.get("recompute_flops", 0.0)
            scale = backward if in_backward else forward
            assert t.model_compute_s == pytest.approx(executed / (t.peak_flops * fraction * scale))
    # flash is not scaled
    h100 = predict(a, H100, profile=default_profile(H100).replace(efficient_attention_forward_scale=0.1,
                                                                  efficient_attention_backward_scale=0.1))
    ref = predict(a, H100)
    assert {t.backend for t in h100.step.ops if t.category == "attention"} == {FLASH}
    assert [t.kernel_s for t in h100.step.ops if t.category == "attention"] == \
        [t.kernel_s for t in ref.step.ops if t.category == "attention"]


def test_latent_attention_heads_run_the_efficient_kernel_at_its_wide_share():
    """DeepSeek's latent attention (q/k head dim 192, v 128): flash refuses differing head
    sizes, so the memory-efficient kernel runs, at flash's fraction x its share of flash x its
    share at heads wider than 128, per pass; with 128/64 heads (still the efficient kernel) it is
    not scaled."""
    from nnperf.hardware.profile import default_profile

    profile = default_profile(H100)
    for sizes, wide in (({}, True), ({"qk_nope_dim": 64, "v_head_dim": 64}, False)):
        a = analyze("deepseek-v3-16b", batch=1, seq_len=512, n_layer=1, amp="bf16", **sizes)
        ops = [t for t in predict(a, H100).step.ops if t.category == "attention"]
        assert ops and {t.backend for t in ops} == {EFFICIENT}
        for t in ops:
            backward = t.op.endswith("_backward")
            fraction = profile.attention_backward_fraction if backward else profile.attention_forward_fraction
            share = profile.wide_head_attention[f"efficient_{'backward' if backward else 'forward'}"] if wide else 1.0
            executed = t.count.flops + t.count.info.get("recompute_flops", 0.0)
            assert t.model_compute_s == pytest.approx(
                executed / (t.peak_flops * fraction * share * (profile.efficient_attention_backward_scale if backward
                                                               else profile.efficient_attention_forward_scale)))
