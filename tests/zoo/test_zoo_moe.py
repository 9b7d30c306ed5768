"""The zoo's mixture-of-experts feed-forward (``zoo.moe``, torchtitan's layout) on one GPU: what
its grouped GEMMs cost, counted by hand, and the routing assumption stated; and its token
bookkeeping run for real: the layer computes what a loop over the experts computes."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nnperf.analysis import analyze
from nnperf.zoo.moe import MoE

D, F_HIDDEN, E, K, T = 64, 96, 8, 2, 32
SMALL = {"n_layer": 1, "dim": D, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": F_HIDDEN, "vocab": 128}


def test_grouped_gemms_cost_what_tokens_x_k_rows_cost():
    """Forward: w1 and w3 (rows x D -> F) and w2 (rows x F -> D), 2 FLOPs per multiply-add;
    backward: both gradients of each (2x forward), the first layer's input gradient included
    (the router's input needs one)."""
    a = analyze("mixtral-8x7b", batch=1, seq_len=T, amp="bf16", **SMALL)
    rows = T * K
    forward = 3 * 2 * rows * D * F_HIDDEN
    grouped = [g for g in a.gemms if g.op == "aten._grouped_mm"]
    assert sum(g.flops for g in grouped if g.phase == "forward") == forward
    assert sum(g.flops for g in grouped) == 3 * forward
    assert any("top-2 of 8 experts" in s and "uniformly" in s for s in a.config["assumptions"])
    assert a.coverage["uncovered"] == []


def test_the_layer_computes_a_loop_over_its_experts():
    torch.manual_seed(0)
    layer = MoE(D, F_HIDDEN, E, K)
    x = torch.randn(2, 16, D)
    out = layer(x)
    h = x.reshape(-1, D)
    scores = F.softmax(layer.gate(h).float(), dim=-1)
    top, chosen = torch.topk(scores, K, dim=-1)
    top = top / top.sum(dim=-1, keepdim=True)
    expected = torch.zeros_like(h)
    w1, w2, w3 = (w.bfloat16() for w in (layer.experts.w1, layer.experts.w2, layer.experts.w3))
    for t in range(h.shape[0]):
        for slot in range(K):
            e = int(chosen[t, slot])
            row = (h[t].float() * top[t, slot]).to(h.dtype).bfloat16()
            y = (F.silu(row @ w1[e].T) * (row @ w3[e].T)) @ w2[e].T
            expected[t] += y.float()
    assert torch.allclose(out.reshape(-1, D), expected, rtol=2e-2, atol=2e-3)


def test_deepseeks_router_scores_the_outputs_and_balances_by_bias():
    """torchtitan's DeepSeek-V3 16B router: experts chosen on softmax + bias, scores gathered
    without it and not renormalized, applied to the experts' outputs; a shared SwiGLU beside."""
    from nnperf.zoo.llama import FeedForward

    torch.manual_seed(0)
    layer = MoE(D, F_HIDDEN, E, K, FeedForward(D, 2 * F_HIDDEN), renormalize=False, score_before_experts=False,
                expert_bias=True)
    layer.expert_bias.copy_(torch.linspace(0, 0.5, E))  # moves the choice away from the top scores
    x = torch.randn(2, 16, D)
    out = layer(x)
    h = x.reshape(-1, D)
    scores = F.softmax(layer.gate(h).float(), dim=-1)
    chosen = torch.topk(scores + layer.expert_bias, K, dim=-1).indices
    expected = layer.shared_expert(h).clone()
    w1, w2, w3 = (w.bfloat16() for w in (layer.experts.w1, layer.experts.w2, layer.experts.w3))
    for t in range(h.shape[0]):
        for slot in range(K):
            e = int(chosen[t, slot])
            row = h[t].bfloat16()
            y = (F.silu(row @ w1[e].T) * (row @ w3[e].T)) @ w2[e].T
            expected[t] += (y.float() * scores[t, e]).to(h.dtype)
    assert torch.allclose(out.reshape(-1, D), expected, rtol=2e-2, atol=2e-3)
    counts = torch.bincount(chosen.reshape(-1), minlength=E).float()
    assert torch.equal(layer.tokens_per_expert, counts)  # what the bias update reads


def test_deepseek_blocks_are_wired_as_torchtitan_builds_them():
    """Block 0 dense (SwiGLU of ffn_hidden), the others MoE with torchtitan's 16B router and
    shared experts n_shared_experts x moe_hidden wide."""
    from nnperf.zoo import get_model

    model = get_model("deepseek-v3-16b").build(1, 8, n_layer=3, dim=32, n_heads=2, kv_lora=16, qk_nope_dim=8,
                                               qk_rope_dim=4, v_head_dim=8, ffn_hidden=48, moe_hidden=12,
                                               n_experts=4, top_k=2, n_shared_experts=2, vocab=50).model
    first, rest = model.layers[0], model.layers[1:]
    assert not hasattr(first, "moe") and first.feed_forward.w1.out_features == 48
    for block in rest:
        moe = block.moe
        assert (moe.renormalize, moe.score_before_experts) == (False, False) and moe.expert_bias is not None
        assert moe.shared_expert.w1.out_features == 2 * 12 and moe.experts.w1.shape == (4, 12, 32)
