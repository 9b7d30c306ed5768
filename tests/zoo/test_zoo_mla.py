"""DeepSeek's multi-head latent attention (``zoo.mla``) against the attention written out from
its definition, and what a trace of it counts."""

from __future__ import annotations

import math

import pytest
import torch

from nnperf.analysis import analyze
from nnperf.zoo.llama import apply_rotary, rotary_tables
from nnperf.zoo.mla import MultiHeadLatentAttention

DIM, HEADS, KV_LORA, NOPE, ROPE, V = 64, 4, 32, 16, 8, 12


def _reference(m: MultiHeadLatentAttention, x: torch.Tensor) -> torch.Tensor:
    """Per head: q = [q_nope, rot(q_pe)], k = [k_nope, rot(k_pe)] with one k_pe for all heads,
    softmax(q k^T / sqrt(192-style head dim), causal) v, heads joined and projected."""
    b, t, _ = x.shape
    if hasattr(m, "wq"):
        q = m.wq(x)
    else:  # the query latent, RMS-normalized, then expanded
        latent_q = m.wq_a(x)
        q = m.wq_b(latent_q * torch.rsqrt(latent_q.pow(2).mean(-1, keepdim=True) + m.q_norm.eps) * m.q_norm.weight)
    q = q.view(b, t, HEADS, NOPE + ROPE)
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


@pytest.mark.parametrize("q_lora", [0, 24])
def test_latent_attention_is_its_definition(q_lora):
    torch.manual_seed(0)
    m = MultiHeadLatentAttention(DIM, HEADS, q_lora, KV_LORA, NOPE, ROPE, V)
    for p in m.parameters():  # norms away from their all-ones start, so the test sees them
        torch.nn.init.normal_(p, std=0.3)
    x = torch.randn(2, 10, DIM)
    assert torch.allclose(m(x), _reference(m, x), atol=1e-5)


@pytest.mark.parametrize("q_lora", [0, 24])
def test_the_trace_counts_its_projections_by_hand(q_lora):
    """Forward projection FLOPs of one block's latent attention, 2 per multiply-add: the query
    projection (wq, or wq_a then wq_b), wkv_a, wkv_b, wo; the attention itself is counted apart
    (``nnperf::attention``)."""
    tokens = 32
    a = analyze("deepseek-v3-16b", batch=1, seq_len=tokens, n_layer=1, n_dense_layers=1, dim=DIM, n_heads=HEADS,
                q_lora=q_lora, kv_lora=KV_LORA, qk_nope_dim=NOPE, qk_rope_dim=ROPE, v_head_dim=V, ffn_hidden=96,
                vocab=128)
    query = DIM * q_lora + q_lora * HEADS * (NOPE + ROPE) if q_lora else DIM * HEADS * (NOPE + ROPE)
    expected = 2 * tokens * (query + DIM * (KV_LORA + ROPE) + KV_LORA * HEADS * (NOPE + V) + HEADS * V * DIM)
    projections = [g for g in a.gemms if g.phase == "forward" and ".attention." in (g.module or "")
                   and g.op != "nnperf::attention"]
    assert sum(g.flops for g in projections) == expected
    assert a.coverage["uncovered"] == []
