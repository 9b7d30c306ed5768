"""DeepSeek's multi-head latent attention (``zoo.mla``) against the attention written out from
its definition, and what a trace of it counts."""

from __future__ import annotations

import math

import torch

from nnperf.analysis import analyze
from nnperf.zoo.llama import apply_rotary, rotary_tables
from nnperf.zoo.mla import MultiHeadLatentAttention

DIM, HEADS, KV_LORA, NOPE, ROPE, V = 64, 4, 32, 16, 8, 12


def _reference(m: MultiHeadLatentAttention, x: torch.Tensor) -> torch.Tensor:
    """Per head: q = [q_nope, rot(q_pe)], k = [k_nope, rot(k_pe)] with one k_pe for all heads,
    softmax(q k^T / sqrt(192-style head dim), causal) v, heads joined and projected."""
    b, t, _ = x.shape
    q = m.wq(x).view(b, t, HEADS, NOPE + ROPE)
    kv_a = m.wkv_a(x)
    latent, k_pe = kv_a[..., :KV_LORA], kv_a[..., KV_LORA:]
    latent = latent * torch.rsqrt(latent.pow(2).mean(-1, keepdim=True) + m.kv_norm.eps) * m.kv_norm.weight
    kv = m.wkv_b(latent).view(b, t, HEADS, NOPE + V)
    cos, sin = rotary_tables(t, ROPE, x)
    heads = []
    for h in range(HEADS):
        qh = torch.cat([q[:, :, h, :NOPE], apply_rotary(q[:, :, h, NOPE:], cos, sin)], dim=-1)
        kh = torch.cat([kv[:, :, h, :NOPE], apply_rotary(k_pe, cos, sin)], dim=-1)
        vh = kv[:, :, h, NOPE:]
        logits = qh @ kh.transpose(-1, -2) / math.sqrt(NOPE + ROPE)
        logits = logits.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        heads.append(logits.softmax(-1) @ vh)
    return m.wo(torch.cat(heads, dim=-1))


def test_latent_attention_is_its_definition():
    torch.manual_seed(0)
    m = MultiHeadLatentAttention(DIM, HEADS, 0, KV_LORA, NOPE, ROPE, V)
    x = torch.randn(2, 10, DIM)
    assert torch.allclose(m(x), _reference(m, x), atol=1e-5)


def test_the_trace_counts_its_projections_by_hand():
    """Forward projection FLOPs of one block's latent attention, 2 per multiply-add: wq, wkv_a,
    wkv_b, wo; the attention itself is counted apart (``nnperf::attention``)."""
    tokens = 32
    a = analyze("deepseek-v3-16b", batch=1, seq_len=tokens, n_layer=1, n_dense_layers=1, dim=DIM, n_heads=HEADS,
                kv_lora=KV_LORA, qk_nope_dim=NOPE, qk_rope_dim=ROPE, v_head_dim=V, ffn_hidden=96, vocab=128)
    expected = 2 * tokens * (DIM * HEADS * (NOPE + ROPE) + DIM * (KV_LORA + ROPE) + KV_LORA * HEADS * (NOPE + V)
                             + HEADS * V * DIM)
    projections = [g for g in a.gemms if g.phase == "forward" and ".attention." in (g.module or "")
                   and g.op != "nnperf::attention"]
    assert sum(g.flops for g in projections) == expected
    assert a.coverage["uncovered"] == []
