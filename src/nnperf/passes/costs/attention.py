"""Fused (flash) attention, forward and backward.

FLOPs are the algorithmic count used by ``torch.utils.flop_counter``: forward = two products
(Q@K^T and P@V), backward = four (dV, dP, dQ, dK), i.e. 2x the forward. Causal masks skip the
masked half of the score matrix, so only the kept (query, key) pairs are counted; an explicit
mask is read but does not reduce work. Flash attention's backward also recomputes Q@K^T: that
extra product is reported as ``info["recompute_flops"]`` for the time model, not as model FLOPs.
Grouped-query attention: work scales with the query heads; K and V are read once per KV head.

FlexAttention (``higher_order.flex_attention``, ``trace.flex_attention``) counts the pairs its
mask keeps as model FLOPs, and the pairs of the blocks its kernel computes (every pair of a
non-empty 128 x 128 block) as ``info["executed_flops"]``, what the time model charges. The
score_mod's own arithmetic inside the kernel is not counted.
"""

from __future__ import annotations

import nnperf.trace.attention  # noqa: F401  (defines the nnperf:: ops registered below)
from nnperf.passes.costs.registry import ATTENTION, OpCost, numel, register, tensors
from nnperf.trace.events import OpEvent, TensorMeta


def kept_pairs(q_len: int, kv_len: int, causal: bool) -> int:
    """(query, key) pairs a kernel computes. PyTorch's ``is_causal`` is top-left aligned
    (``tril(diagonal=0)``): query row i keeps keys j <= i, i.e. min(i + 1, kv_len) of them."""
    if not causal:
        return q_len * kv_len
    if kv_len >= q_len:
        return q_len * (q_len + 1) // 2
    return kv_len * (kv_len + 1) // 2 + (q_len - kv_len) * kv_len


def _attention_geometry(q: TensorMeta, k: TensorMeta, v: TensorMeta, causal: bool):
    batch_heads = numel(q.shape[:-2])
    pairs = kept_pairs(q.shape[-2], k.shape[-2], causal)
    e, ev = q.shape[-1], v.shape[-1]
    return batch_heads * pairs * (e + ev)  # MACs of Q@K^T plus P@V


@register("nnperf.attention")
def _attention_forward(event: OpEvent) -> OpCost:
    q, k, v = event.args[:3]
    mask = event.args[3]
    causal = bool(event.args[5])
    macs = _attention_geometry(q, k, v, causal)
    reads = [q, k, v] + ([mask] if isinstance(mask, TensorMeta) else [])
    return OpCost(
        ATTENTION,
        flops=2 * macs,
        macs=macs,
        reads=reads,
        writes=event.outputs,
        info={"causal": causal, "masked": isinstance(mask, TensorMeta)},
    )


@register("nnperf.attention_backward")
def _attention_backward(event: OpEvent) -> OpCost:
    grad_out, q, k, v, out, lse, mask = event.args[:7]
    causal = bool(event.args[8])
    fwd_macs = _attention_geometry(q, k, v, causal)
    macs = 2 * fwd_macs
    score_macs = numel(q.shape[:-2]) * kept_pairs(q.shape[-2], k.shape[-2], causal) * q.shape[-1]
    return OpCost(
        ATTENTION,
        flops=2 * macs,
        macs=macs,
        reads=tensors([grad_out, q, k, v, out, lse, mask]),
        writes=event.outputs,
        info={"causal": causal, "recompute_flops": 2 * score_macs},
    )


def _flex_pairs(event: OpEvent) -> tuple[int, int]:
    values = event.values or {}
    return values["kept_pairs"][0], values["executed_pairs"][0]


@register("higher_order.flex_attention", since="2.5")
def _flex_forward(event: OpEvent) -> OpCost:
    q, v = event.args[0], event.args[2]
    kept, executed = _flex_pairs(event)
    width = q.shape[-1] + v.shape[-1]  # MACs per pair: Q@K^T and P@V
    return OpCost(
        ATTENTION,
        flops=2 * kept * width,
        macs=kept * width,
        reads=event.inputs,
        writes=event.outputs,
        info={"executed_flops": 2 * executed * width, "kept_pairs": kept, "executed_pairs": executed},
    )


@register("higher_order.flex_attention_backward", since="2.5")
def _flex_backward(event: OpEvent) -> OpCost:
    q, v = event.args[0], event.args[2]
    kept, executed = _flex_pairs(event)
    width = q.shape[-1] + v.shape[-1]
    return OpCost(
        ATTENTION,
        flops=4 * kept * width,  # dV, dP, dQ, dK: twice the forward's products
        macs=2 * kept * width,
        reads=event.inputs,
        writes=event.outputs,
        info={"executed_flops": 4 * executed * width, "recompute_flops": 2 * executed * q.shape[-1],
              "kept_pairs": kept, "executed_pairs": executed},
    )
