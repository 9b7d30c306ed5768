"""An independent count of a training step's matrix FLOPs, for the hub tests.

The model is the library's own (built by transformers, timm or torchvision, not through
nnperf); PyTorch's ``FlopCounterMode`` counts its forward, loss and backward on fake or meta
tensors, and its known mistakes are corrected by hand from the calls recorded in the same run:

- SDPA runs on the MATH backend, which decomposes attention into ``bmm`` products the counter
  sees (CPU flash attention is invisible to it up to torch 2.14); MATH computes causal
  attention as full products and masks after, while nnperf counts only the (query, key) pairs a
  causal kernel computes (README, Conventions): for each ``is_causal`` call the masked pairs of
  PyTorch's top-left mask are subtracted, 2 products x 2 FLOPs forward and twice that backward.
- ``convolution_backward``'s weight gradient ignores ``groups`` (it counts C_in x C_out
  filters where a grouped convolution has C_in/g x C_out): the excess (1 - 1/g) is removed.
- ``aten._grouped_mm`` (transformers' MoE experts) has no formula in FlopCounterMode (torch
  2.14): counted by hand, 2 x M x K x N per call (each row of the 2-D operand meets one group).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

#: nnperf's op categories that hold matrix work
MATRIX_CATEGORIES = ("gemm", "conv", "attention")


@dataclass
class Step:
    """What one reference step recorded."""

    params: int
    counted: dict[str, int]  # FlopCounterMode per aten op
    causal_masked_flops: int = 0  # what MATH counted for pairs a causal kernel skips
    sdpa_flops: int = 0  # all SDPA calls as MATH counts them (forward + backward)
    grouped_conv_excess: int = 0
    grouped_mm_flops: int = 0
    sdpa_calls: int = 0
    causal_calls: int = 0
    grouped_convs: int = 0
    grouped_mm_calls: int = 0
    notes: list[str] = field(default_factory=list)

    def expected(self, *, attention_uncovered: bool = False) -> int:
        """nnperf's gemm + conv + attention FLOPs as they should be."""
        total = sum(v for k, v in self.counted.items() if "_grouped_mm" not in k)
        total += self.grouped_mm_flops - self.causal_masked_flops - self.grouped_conv_excess
        if attention_uncovered:  # nnperf lists the attention op uncovered: none of it counted
            total -= self.sdpa_flops - self.causal_masked_flops
        return total


def unique_params(model: torch.nn.Module) -> int:
    """The library's own count: ``model.parameters()`` yields a tied weight once."""
    return sum(p.numel() for p in model.parameters())


@contextlib.contextmanager
def _record_sdpa(step: Step) -> Iterator[None]:
    """Wrap ``F.scaled_dot_product_attention`` (transformers and ``nn.MultiheadAttention``
    look it up there at call time) to note each call's shapes and mask."""
    original = F.scaled_dot_product_attention

    def recorded(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        bh = math.prod(q.shape[:-2])
        L, S, d, dv = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
        forward = 2 * bh * L * S * (d + dv)  # Q@K^T and P@V
        step.sdpa_flops += 3 * forward  # MATH's backward: four products, twice the forward
        step.sdpa_calls += 1
        if is_causal and attn_mask is None:
            kept = sum(min(i + 1, S) for i in range(L))  # top-left: row i sees keys 0..i
            step.causal_masked_flops += 3 * 2 * bh * (L * S - kept) * (d + dv)
            step.causal_calls += 1
        return original(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                        scale=scale, enable_gqa=enable_gqa)

    F.scaled_dot_product_attention = recorded
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


class _RecordOps(TorchDispatchMode):
    """Grouped convolutions' weight gradients and grouped GEMMs, by their shapes."""

    def __init__(self, step: Step):
        super().__init__()
        self.step = step

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        packet = func.overloadpacket
        if packet is torch.ops.aten.convolution_backward:
            grad_out, x, w = args[0], args[1], args[2]
            groups, mask = args[9], args[10]
            if groups > 1 and mask[1]:
                n, c_in = x.shape[0], x.shape[1]
                k = grad_out.shape[1]
                counted = 2 * n * c_in * k * math.prod(grad_out.shape[2:]) * math.prod(w.shape[2:])
                self.step.grouped_conv_excess += counted - counted // groups
                self.step.grouped_convs += 1
        elif packet is getattr(torch.ops.aten, "_grouped_mm", None):
            a, b = args[0], args[1]
            if a.dim() == 2 and b.dim() == 3:  # (M, K) x (G, K, N): each row meets one group
                flops = 2 * a.shape[0] * a.shape[1] * b.shape[2]
            elif a.dim() == 2 and b.dim() == 2:  # (K, M) x (M, N) -> (G, K, N): weight gradient
                flops = 2 * a.shape[0] * a.shape[1] * b.shape[1]
            else:  # batched (G, M, K) x (G, K, N)
                flops = 2 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[-1]
            self.step.grouped_mm_flops += flops
            self.step.grouped_mm_calls += 1
        return func(*args, **kwargs)


def training_step(model: torch.nn.Module, run: Callable[[torch.nn.Module], torch.Tensor]) -> Step:
    """Count ``run(model).backward()`` (``run`` returns the loss) on the model's own tensors
    (fake or meta)."""
    model.train()
    step = Step(params=unique_params(model), counted={})
    with sdpa_kernel(SDPBackend.MATH), _record_sdpa(step), FlopCounterMode(display=False) as counter, \
            _RecordOps(step):
        run(model).backward()
    step.counted = {str(k): int(v) for k, v in counter.get_flop_counts()["Global"].items()}
    return step


def nnperf_matrix_flops(analysis: Any) -> int:
    return int(sum(op.flops for op in analysis.ops if op.category in MATRIX_CATEGORIES))


def uncovered_ops(analysis: Any) -> set[str]:
    return {u["op"] for u in analysis.coverage["uncovered"]}
