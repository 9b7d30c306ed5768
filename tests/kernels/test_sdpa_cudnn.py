"""``--sdpa cudnn``: SDPA with cuDNN's fused kernel first in PyTorch's priority order (and the
kernel Transformer Engine's fused attention runs on Hopper), timed at its per-pass share of
flash's rate. Costs: two small traces (~3 s)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from nnperf.analysis import analyze
from nnperf.errors import UsageError
from nnperf.hardware import load_gpu
from nnperf.hardware.profile import default_profile
from nnperf.kernels.attention import CUDNN, EFFICIENT, FLASH, SdpaCall, select_backend
from nnperf.prediction import predict

H100, A100, V100 = (load_gpu(n) for n in ("h100", "a100", "v100"))
# [B, H, S, D] views of [B, S, H, D], what q = linear(x).view(B, S, H, D).transpose(1, 2) is
_S = (256 * 8 * 64, 64, 8 * 64, 1)
PROJECTED = SdpaCall(dtype="bf16", batch=2, heads_q=8, heads_kv=8, q_len=256, kv_len=256, head_dim=64,
                     head_dim_k=64, head_dim_v=64, causal=True, requires_grad=True, strides=(_S, _S, _S))


def test_cudnn_first_where_its_checks_pass():
    assert select_backend(PROJECTED, H100) == FLASH  # PyTorch's default order
    assert select_backend(PROJECTED, H100, cudnn_first=True) == CUDNN
    assert select_backend(PROJECTED, A100, cudnn_first=True) == CUDNN  # sm 8.0 has the kernel
    fp16 = replace(PROJECTED, dtype="fp16")
    assert select_backend(fp16, V100, cudnn_first=True) == EFFICIENT  # below sm 8.0: no cuDNN kernel
    fp32 = replace(PROJECTED, dtype="fp32")  # cuDNN's kernel is 16-bit only: the next in order
    assert select_backend(fp32, H100, cudnn_first=True) == select_backend(fp32, H100)


def test_hopper_shares_are_the_published_side_by_side_rates():
    """The profile's Hopper shares against NVIDIA/cudnn-frontend's benchmark_results.csv (H200,
    bf16, causal, 16 heads of 128; TFLOP/s of PyTorch's flash backend and of cuDNN on the same
    runs): the mean of the 4096- and 8192-token rows' ratios, per pass."""
    pytorch_fwd, pytorch_bwd = (314.06, 325.14), (248.76, 277.44)
    cudnn_fwd, cudnn_bwd = (542.32, 572.86), (443.60, 463.54)
    profile = default_profile(H100)
    forward = sum(c / p for c, p in zip(cudnn_fwd, pytorch_fwd, strict=True)) / 2
    backward = sum(c / p for c, p in zip(cudnn_bwd, pytorch_bwd, strict=True)) / 2
    assert profile.cudnn_attention_forward_scale == pytest.approx(forward, abs=0.005)
    assert profile.cudnn_attention_backward_scale == pytest.approx(backward, abs=0.005)
    assert default_profile(A100).cudnn_attention_forward_scale == 1.0  # not measured: flash's


def test_cudnn_attention_runs_at_its_share_of_flash():
    """On an H100, a bf16 causal attention of 2048 tokens is compute bound: with ``--sdpa
    cudnn`` its modelled compute time is the executed FLOPs over peak x flash's fraction x
    cuDNN's share for that pass; the rest of the step is unchanged."""
    kwargs = dict(batch=2, seq_len=2048, n_layer=1, dim=1024, n_heads=8, n_kv_heads=8, vocab=256, amp="bf16")
    fused = predict(analyze("llama-7b", **kwargs), H100)
    cudnn = predict(analyze("llama-7b", sdpa="cudnn", **kwargs), H100)
    profile = default_profile(H100)
    attention = [t for t in cudnn.step.ops if t.category == "attention"]
    assert len(attention) == 2 and {t.backend for t in attention} == {CUDNN}
    for t in attention:
        backward = t.op.endswith("_backward")
        fraction = profile.attention_backward_fraction if backward else profile.attention_forward_fraction
        share = profile.cudnn_attention_backward_scale if backward else profile.cudnn_attention_forward_scale
        executed = t.count.flops + t.count.info.get("recompute_flops", 0.0)
        assert t.model_compute_s == pytest.approx(executed / (t.peak_flops * fraction * share))
    others = [t.kernel_s for t in fused.step.ops if t.category != "attention"]
    assert others == [t.kernel_s for t in cudnn.step.ops if t.category != "attention"]


def test_cudnn_on_a_model_without_sdpa_is_refused():
    with pytest.raises(UsageError, match="--sdpa cudnn changes nothing here"):
        analyze("mlp", batch=2, sdpa="cudnn")
