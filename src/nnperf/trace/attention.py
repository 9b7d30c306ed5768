"""Scaled-dot-product attention the way a GPU runs it: fused, or unfused on request.

On CPU, meta or fake tensors PyTorch either decomposes ``F.scaled_dot_product_attention``
into matmuls and a softmax (a different cost and memory profile from flash attention) or
picks a CPU-only kernel. The tracer therefore routes every SDPA call through
``nnperf::attention`` and its backward ``nnperf::attention_backward``: one forward and one
backward record with every argument the cost formulas need (causal, mask, GQA, scale).
Real implementations exist too, so tracing on small real tensors gives correct values.

``TraceOptions.sdpa == "cudnn"`` records the same calls: which kernel runs them is the timing's
choice (``kernels.attention.select_backend`` with cuDNN first). ``"unfused"`` (``--sdpa unfused``) traces SDPA as the unfused kernels
instead (``unfused_sdpa``): the query scaled, one batched GEMM for the scores, the causal or
given mask, softmax, dropout (CUDA's ``native_dropout``), one GEMM with the values, all in the
input's dtype, the score matrix written to memory and kept for backward. That is PyTorch's
math decomposition (``aten/src/ATen/native/transformers/attention.cpp``,
``_scaled_dot_product_attention_math``) with reduced-precision math allowed
(``torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)``; by default the math
backend upcasts 16-bit inputs to fp32), and the core attention of Megatron-LM before flash
attention (``megatron/model/transformer.py`` 2022: ``baddbmm``, ``FusedScaleMaskSoftmax``,
dropout, ``bmm``; its fused kernel masks and normalizes in one pass where this takes two).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
from torch import Tensor

from nnperf.errors import UsageError


def _expand_kv(q: Tensor, kv: Tensor, enable_gqa: bool) -> Tensor:
    if enable_gqa and kv.dim() >= 3 and kv.shape[-3] != q.shape[-3]:
        return kv.repeat_interleave(q.shape[-3] // kv.shape[-3], dim=-3)
    return kv


def _acc(t: Tensor) -> Tensor:
    """Accumulate in fp32 at least (low precision inputs), fp64 for fp64 inputs."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _scores(q, k, attn_mask, is_causal, scale, enable_gqa):
    k = _expand_kv(q, k, enable_gqa)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (_acc(q) @ _acc(k).transpose(-2, -1)) * scale
    if is_causal:
        L, S = q.shape[-2], k.shape[-2]
        keep = torch.ones(L, S, dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            s = s.masked_fill(~attn_mask, float("-inf"))
        else:
            s = s + _acc(attn_mask)
    return s


@torch.library.custom_op("nnperf::attention", mutates_args=())
def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
) -> tuple[Tensor, Tensor]:
    """Fused attention forward: returns the output and the row log-sum-exp (as flash does)."""
    s = _scores(q, k, attn_mask, is_causal, scale, enable_gqa)
    lse = torch.logsumexp(s, dim=-1).float()  # fp32, as the fake implementation says
    p = torch.exp(s - lse.unsqueeze(-1))
    out = p @ _acc(_expand_kv(q, v, enable_gqa))
    return _kernel_layout(q, v.shape[-1]).copy_(out), lse


@attention.register_fake
def _attention_fake(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
    return _kernel_layout(q, v.shape[-1]), lse


def _kernel_layout(q: Tensor, head_dim_v: int) -> Tensor:
    """An empty output in the layout the fused kernel writes. CUDA's flash and memory-efficient
    kernels write (batch, sequence, heads, dim) in memory, seen as (batch, heads, sequence,
    dim) ("at::empty({batch, seqlen_q, num_heads, head_dim_v})" then ``.transpose(1, 2)``), and
    the usual ``out.transpose(1, 2).reshape(...)`` that merges the heads is then a view, not a
    copy: the GPU's op lists (validation/cuda_ops.py, H200 2026-11-28) show no copy there,
    where a (batch, heads, ...)-contiguous output traced one. The CPU's kernel returns it
    (batch, heads, ...)-contiguous (torch 2.13, fp32 and bf16), so a step traced for the CPU
    (``TraceOptions.autocast_device``) keeps that layout and its copy."""
    if q.dim() != 4 or _CPU_KERNELS[0]:
        return q.new_empty((*q.shape[:-1], head_dim_v))
    b, h, s, _ = q.shape
    return q.new_empty((b, s, h, head_dim_v)).transpose(1, 2)


@torch.library.custom_op("nnperf::attention_backward", mutates_args=())
def attention_backward(
    grad_out: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    attn_mask: Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """Fused attention backward (recomputes the probabilities, as flash attention does).

    The gradients are written out rather than taken with autograd: a custom op's
    implementation runs below the autograd dispatch key, where no graph is recorded.
    """
    kx = _acc(_expand_kv(q, k, enable_gqa))
    vx = _acc(_expand_kv(q, v, enable_gqa))
    p = torch.softmax(_scores(q, k, attn_mask, is_causal, scale, enable_gqa), dim=-1)
    do = _acc(grad_out)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    dv = p.transpose(-2, -1) @ do
    dp = do @ vx.transpose(-2, -1)
    ds = p * (dp - (dp * p).sum(dim=-1, keepdim=True))  # softmax backward
    dq = (ds @ kx) * scale
    dk = (ds.transpose(-2, -1) @ _acc(q)) * scale
    # gradients in the layout of their inputs, as flash kernels (and the fake impl) give them
    return (
        torch.empty_like(q).copy_(dq),
        torch.empty_like(k).copy_(_reduce_kv(dk, k)),
        torch.empty_like(v).copy_(_reduce_kv(dv, v)),
    )


def _reduce_kv(grad: Tensor, kv: Tensor) -> Tensor:
    """Sum the gradient of KV heads that grouped-query attention repeated."""
    if grad.shape[-3] == kv.shape[-3]:
        return grad
    groups = grad.shape[-3] // kv.shape[-3]
    return grad.unflatten(-3, (kv.shape[-3], groups)).sum(dim=-3)


@attention_backward.register_fake
def _attention_backward_fake(grad_out, q, k, v, out, lse, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, attn_mask)
    ctx.params = (dropout_p, is_causal, scale, enable_gqa)
    ctx.set_materialize_grads(False)  # no zeros for the unused log-sum-exp gradient


def _backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse, attn_mask = ctx.saved_tensors
    dq, dk, dv = torch.ops.nnperf.attention_backward(
        grad_out, q, k, v, out, lse, attn_mask, *ctx.params
    )
    return dq, dk, dv, None, None, None, None, None


attention.register_autograd(_backward, setup_context=_setup_context)


def fused_sdpa(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    """Drop-in for ``F.scaled_dot_product_attention`` that traces as one fused op."""
    out, _ = torch.ops.nnperf.attention(
        query, key, value, attn_mask, float(dropout_p), bool(is_causal), scale, bool(enable_gqa)
    )
    return out


_MODE = ["fused"]  # a TraceOptions.sdpa value
_CPU_KERNELS = [False]  # the step runs the CPU's fused kernel (its output layout differs)
_CALLS = [0]


def no_sdpa_called(mode: str) -> str:
    """The refusal of an SDPA mode the step never reached."""
    return (f"--sdpa {mode} changes nothing here: the step calls no F.scaled_dot_product_attention "
            "(a model without attention, or attention written out as GEMMs and softmax, e.g. "
            "--attn-implementation eager, which is traced as written); leave it out")


NO_SDPA_CALLED = no_sdpa_called("unfused")


@contextlib.contextmanager
def sdpa_mode(mode: str, cpu_kernels: bool = False) -> Iterator[None]:
    """Trace SDPA calls as ``mode`` (``TraceOptions.sdpa``) for the duration: the recording and the
    recomputations of checkpointed blocks within it; ``cpu_kernels``: as the CPU's fused kernel
    lays its output out (``_kernel_layout``). A mode other than the default that the step
    never used is refused, like ``--channels-last`` on a model without 4-D tensors: a setting that would not
    reach the model (whether the step calls SDPA is known only once it has run)."""
    before, before_cpu, calls = _MODE[0], _CPU_KERNELS[0], _CALLS[0]
    _MODE[0], _CPU_KERNELS[0] = mode, cpu_kernels
    try:
        yield
        if mode != "fused" and _CALLS[0] == calls:
            raise UsageError(no_sdpa_called(mode))
    finally:
        _MODE[0], _CPU_KERNELS[0] = before, before_cpu


def traced_sdpa(*args, **kwargs) -> Tensor:
    """``F.scaled_dot_product_attention`` as the current mode traces it."""
    _CALLS[0] += 1
    return (unfused_sdpa if _MODE[0] == "unfused" else fused_sdpa)(*args, **kwargs)


def unfused_sdpa(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    """SDPA as the unfused kernels, in the input's dtype (module docstring)."""
    k = _expand_kv(query, key, enable_gqa)
    v = _expand_kv(query, value, enable_gqa)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = torch.matmul(query * scale, k.transpose(-2, -1))
    if is_causal:
        L, S = query.shape[-2], k.shape[-2]
        future = torch.ones(L, S, dtype=torch.bool, device=query.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(attn_mask.logical_not(), float("-inf"))
        else:
            scores = scores + attn_mask
    probs = torch.softmax(scores, dim=-1)
    if dropout_p > 0.0:
        probs = torch.ops.aten.native_dropout(probs, float(dropout_p), True)[0]
    return torch.matmul(probs, v)
