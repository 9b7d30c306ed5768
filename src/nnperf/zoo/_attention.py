"""One place that calls scaled_dot_product_attention, so tracing sees a single attention op.

Grouped-query attention uses SDPA's ``enable_gqa`` where this torch has it (>= 2.5) and
otherwise repeats k/v heads, which costs the same FLOPs but more memory traffic.
"""

from __future__ import annotations

import inspect

import torch.nn.functional as F
from torch import Tensor


def _sdpa_has_gqa() -> bool:
    fn = F.scaled_dot_product_attention
    try:
        return "enable_gqa" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature: read its documented one
        return "enable_gqa" in (fn.__doc__ or "").split("->")[0]


SDPA_HAS_GQA = _sdpa_has_gqa()


def attention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, dropout_p: float = 0.0) -> Tensor:
    """Attention over (B, heads, T, head_dim) tensors; k/v may have fewer heads than q."""
    n_head, n_kv = q.size(-3), k.size(-3)
    if n_kv == n_head:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=causal)
    if SDPA_HAS_GQA:
        return F.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout_p, is_causal=causal, enable_gqa=True
        )
    repeat = n_head // n_kv
    k = k.repeat_interleave(repeat, dim=-3)
    v = v.repeat_interleave(repeat, dim=-3)
    return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=causal)


def split_heads(x: Tensor, head_dim: int) -> Tensor:
    """(B, T, H*D) -> (B, H, T, D), the layout SDPA expects. The head count follows the width,
    so a tensor-parallel shard of the projection (H/TP heads) splits into its own heads."""
    b, t, c = x.shape
    return x.view(b, t, c // head_dim, head_dim).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """(B, H, T, D) -> (B, T, H*D), undoing ``split_heads``."""
    b, h, t, d = x.shape
    return x.transpose(1, 2).reshape(b, t, h * d)
