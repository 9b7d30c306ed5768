"""One place that calls scaled_dot_product_attention, so tracing sees a single attention op.

Grouped-query attention uses SDPA's ``enable_gqa`` where this torch has it (>= 2.5) and
otherwise repeats k/v heads, which costs the same FLOPs but more memory traffic.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import BlockMask


def _sdpa_has_gqa() -> bool:
    fn = F.scaled_dot_product_attention
    try:
        return "enable_gqa" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature: read its documented one
        return "enable_gqa" in (fn.__doc__ or "").split("->")[0]


SDPA_HAS_GQA = _sdpa_has_gqa()


#: How a zoo decoder attends (its ``attention`` option): SDPA with ``is_causal``, or
#: FlexAttention with a causal BlockMask built once per forward, as torchtitan's
#: ``use_flex_attn`` does (its ``attn_mask_type = "block_causal"`` with ``doc_len``).
ATTENTION_KINDS = ("sdpa", "flex")


def causal_block_mask(seq: int, doc_len: int, device: torch.device) -> BlockMask:
    """FlexAttention's causal mask over ``seq`` tokens; with ``doc_len``, block-causal: tokens
    attend within their own document of ``doc_len`` tokens, the sequence packed with them."""
    from torch.nn.attention.flex_attention import create_block_mask  # torch >= 2.5

    if doc_len:
        def mask_mod(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
            return (q >= kv) & (q // doc_len == kv // doc_len)
    else:
        def mask_mod(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
            return q >= kv
    return create_block_mask(mask_mod, None, None, seq, seq, device=device)


@functools.cache
def compiled_flex_attention() -> Callable[..., Tensor]:
    """``torch.compile(flex_attention)``, as torchtitan calls it: on a GPU its fused Triton
    kernel (uncompiled, PyTorch computes the whole score matrix); a trace records its op either
    way (``trace.flex_attention``)."""
    from torch.nn.attention.flex_attention import flex_attention  # torch >= 2.5

    return torch.compile(flex_attention)


def attention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, dropout_p: float = 0.0,
              block_mask: BlockMask | None = None) -> Tensor:
    """Attention over (B, heads, T, head_dim) tensors; k/v may have fewer heads than q.
    With ``block_mask``: FlexAttention under that mask (``causal`` is the mask's business)."""
    n_head, n_kv = q.size(-3), k.size(-3)
    if block_mask is not None:
        return compiled_flex_attention()(q, k, v, block_mask=block_mask, enable_gqa=n_kv != n_head)
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
