"""Multi-head latent attention (MLA), DeepSeek-V2/V3's attention, as torchtitan writes it
(``torchtitan/models/deepseek_v3/model/model.py``, ``Attention``).

Keys and values come from one low-rank latent per token: ``wkv_a`` projects the hidden state to
``kv_lora`` latent features plus one rotary key of ``qk_rope_dim`` shared by every head, the
latent is RMS-normalized and ``wkv_b`` expands it to each head's non-rotary key
(``qk_nope_dim``) and value (``v_head_dim``). Queries come from ``wq`` (``q_lora`` 0) or from
their own latent (``wq_a``, ``q_norm``, ``wq_b``). A head's key is its non-rotary part joined
to the shared rotary part, so queries and keys are ``qk_nope_dim + qk_rope_dim`` wide and
values ``v_head_dim``: SDPA gets unequal head sizes, which rules out the flash kernel
(``kernels.attention``). The rotation uses the real-arithmetic half-split form of
``zoo.llama`` (in the activations' dtype, tables built per layer) where torchtitan multiplies
complex numbers in fp32 from one precomputed table: element-wise work on the same
``qk_rope_dim`` features, a few bytes per token apart.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import BlockMask

from ._attention import attention
from .llama import RMSNorm, apply_rotary, own_block_mask, rotary_tables


class MultiHeadLatentAttention(nn.Module):
    """Queries, the shared key/value latent, causal SDPA and the output projection."""

    def __init__(self, dim: int, n_heads: int, q_lora: int, kv_lora: int, qk_nope_dim: int, qk_rope_dim: int,
                 v_head_dim: int, flex_doc_len: int | None = None) -> None:
        super().__init__()
        self.flex_doc_len = flex_doc_len
        self.qk_nope_dim, self.qk_rope_dim, self.v_head_dim = qk_nope_dim, qk_rope_dim, v_head_dim
        self.qk_head_dim = qk_nope_dim + qk_rope_dim
        self.kv_lora = kv_lora
        if q_lora:
            self.wq_a = nn.Linear(dim, q_lora, bias=False)
            self.q_norm = RMSNorm(q_lora)
            self.wq_b = nn.Linear(q_lora, n_heads * self.qk_head_dim, bias=False)
        else:
            self.wq = nn.Linear(dim, n_heads * self.qk_head_dim, bias=False)
        self.wkv_a = nn.Linear(dim, kv_lora + qk_rope_dim, bias=False)
        self.kv_norm = RMSNorm(kv_lora)
        self.wkv_b = nn.Linear(kv_lora, n_heads * (qk_nope_dim + v_head_dim), bias=False)
        self.wo = nn.Linear(n_heads * v_head_dim, dim, bias=False)

    def forward(self, x: Tensor, block_mask: BlockMask | None = None) -> Tensor:
        b, t, _ = x.shape
        q = self.wq(x) if hasattr(self, "wq") else self.wq_b(self.q_norm(self.wq_a(x)))
        q = q.view(b, t, -1, self.qk_head_dim).transpose(1, 2)  # heads follow the width (a TP shard's own)
        q_nope, q_pe = torch.split(q, [self.qk_nope_dim, self.qk_rope_dim], dim=-1)
        latent, k_pe = torch.split(self.wkv_a(x), [self.kv_lora, self.qk_rope_dim], dim=-1)
        cos, sin = rotary_tables(t, self.qk_rope_dim, q)
        q = torch.cat([q_nope, apply_rotary(q_pe, cos, sin)], dim=-1)
        k_pe = apply_rotary(k_pe.unsqueeze(1), cos, sin)  # (b, 1, t, rope): one rotary key for all heads
        kv = self.wkv_b(self.kv_norm(latent)).view(b, t, -1, self.qk_nope_dim + self.v_head_dim).transpose(1, 2)
        k_nope, v = torch.split(kv, [self.qk_nope_dim, self.v_head_dim], dim=-1)
        k = torch.cat([k_nope, k_pe.expand(-1, k_nope.shape[1], -1, -1)], dim=-1)
        block_mask = own_block_mask(self.flex_doc_len, block_mask, x)
        if block_mask is not None:
            out = attention(q, k, v, causal=True, block_mask=block_mask)
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, t, -1))
