"""FlexAttention's kernel time: the pairs of the blocks it computes, at its published share of
flash's rate (``flex_attention_*_scale``), worked out by hand for a causal mask."""

from __future__ import annotations

import pytest

from nnperf.analysis import analyze
from nnperf.hardware import load_gpu
from nnperf.hardware.profile import default_profile
from nnperf.kernels.attention import FLEX
from nnperf.prediction import predict

H100, A100 = load_gpu("h100"), load_gpu("a100-80gb-sxm")
SEQ, HEADS, HEAD_DIM, BLOCK = 2048, 4, 128, 128


def _flex_times(gpu):
    a = analyze("llama-7b", n_layer=1, dim=HEADS * HEAD_DIM, n_heads=HEADS, ffn_hidden=256, vocab=64,
                seq_len=SEQ, amp="bf16", attention="flex")
    return [t for t in predict(a, gpu).step.ops if t.category == "attention"]


def test_the_shares_of_flash_come_from_their_sources():
    """PyTorch's FlexAttention blog (A100, against FA2): 90% forward, 85% backward. Hopper: the
    H200 microbenchmark committed in validation/data/h200-sxm/profile.json, worked out here
    from its 128/128 rows: flash's time over flex's, times the pairs flex computes (every pair
    of its non-empty 128 x 128 blocks) over the causal pairs kept."""
    import json
    from pathlib import Path

    a100, h100 = default_profile(A100), default_profile(H100)
    assert (a100.flex_attention_forward_scale, a100.flex_attention_backward_scale) == (0.90, 0.85)
    rows = json.loads((Path(__file__).parents[2] / "validation/data/h200-sxm/profile.json").read_text())["attention"]
    by = {(r["backend"], r["batch"], r["tokens"]): r for r in rows if r["head_dim"] == 128 and r.get("forward_s")}
    for phase, default in (("forward", h100.flex_attention_forward_scale),
                           ("backward", h100.flex_attention_backward_scale)):
        shares = []
        for batch, tokens in ((8, 4096), (2, 8192)):
            flash, flex = by["flash", batch, tokens], by["flex", batch, tokens]
            blocks = tokens // BLOCK
            executed = batch * 16 * blocks * (blocks + 1) // 2 * BLOCK * BLOCK
            kept = batch * 16 * tokens * (tokens + 1) // 2
            shares.append(flash[f"{phase}_s"] / flex[f"{phase}_s"] * executed / kept)
        assert default == pytest.approx(sum(shares) / 2, abs=0.005)  # the median of two, to 2 decimals


@pytest.mark.parametrize("gpu", [H100, A100], ids=["h100", "a100"])
def test_a_causal_kernel_computes_its_blocks_at_the_flex_rate(gpu):
    """2048 causal tokens in 128-blocks: 16 * 17 / 2 = 136 blocks computed per head. Forward:
    two products over them; backward: four, and Q@K^T once more."""
    profile = default_profile(gpu)
    pairs = HEADS * 136 * BLOCK * BLOCK
    forward, backward = _flex_times(gpu)
    assert forward.backend == backward.backend == FLEX
    fwd_flops = 2 * pairs * (HEAD_DIM + HEAD_DIM)
    bwd_flops = 2 * fwd_flops + 2 * pairs * HEAD_DIM
    fwd_rate = forward.peak_flops * profile.attention_forward_fraction * profile.flex_attention_forward_scale
    bwd_rate = backward.peak_flops * profile.attention_backward_fraction * profile.flex_attention_backward_scale
    assert forward.model_compute_s == pytest.approx(fwd_flops / fwd_rate)
    assert backward.model_compute_s == pytest.approx(bwd_flops / bwd_rate)
    assert forward.peak_flops == gpu.matmul_peak("bf16").flops
