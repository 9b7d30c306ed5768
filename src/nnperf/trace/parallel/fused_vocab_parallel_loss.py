"""Megatron-Core's fused cross entropy (``--cross-entropy-loss-fusion``, its native
implementation), the kernels it runs as ops.

megatron/core/fusions/fused_cross_entropy.py (``fused_vocab_parallel_cross_entropy``) runs the
unfused function's arithmetic (``trace.parallel.vocab_parallel_loss``) in four functions, each
wrapped in ``jit_fuser`` (megatron/core/jit.py: ``torch.compile`` from PyTorch 2.2 on), so each
runs as one fused kernel over the logits:

- ``calculate_logits_max``: the fp32 copy of the logits and each row's maximum, one pass
  (reads the 16-bit logits, writes the fp32 copy);
- ``calculate_predicted_logits``: the maximum subtracted in place, the target's logit picked,
  exponentiated in place and summed, one pass (reads and writes the fp32 copy); the picked
  logits and the sums go out as one tensor, so one all-reduce over the tensor-parallel group
  takes both;
- ``calculate_cross_entropy_loss``: the exponentials divided by their sums in place (the
  softmax kept for backward) and the loss, one pass (reads and writes the fp32 copy);
- backward, ``calculate_gradients``: the target's entry less one and the scale by the output
  gradient, in place, then the cast to bf16, one pass: a compiled function writes back what it
  mutates in its inputs, so it writes the fp32 softmax as well as the 16-bit gradient.

So 32 bytes an element of the logits move (2 + 4, 4 + 4, 4 + 4, 4 + 4 + 2) where the unfused
function's separate kernels move 52, in four kernels instead of about eleven. Each function is
one ``nnperf::megatron_ce_*`` op here (costs in ``passes.costs.losses``); the all-reduces, the
fp32 copy kept for backward and its in-place updates are Megatron-Core's.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor


@torch.library.custom_op("nnperf::megatron_ce_max", mutates_args=())
def megatron_ce_max(logits: Tensor) -> tuple[Tensor, Tensor]:
    """``calculate_logits_max``: the logits' fp32 copy and each row's maximum."""
    copy = logits.to(torch.float32, copy=True)
    return copy, copy.amax(dim=-1)


@megatron_ce_max.register_fake
def _max_fake(logits: Tensor) -> tuple[Tensor, Tensor]:
    return torch.empty_like(logits, dtype=torch.float32), logits.new_empty(logits.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("nnperf::megatron_ce_exp", mutates_args=("logits",))
def megatron_ce_exp(logits: Tensor, row_max: Tensor, target: Tensor, start: int) -> tuple[Tensor, Tensor, Tensor]:
    """``calculate_predicted_logits`` on the fp32 copy, in place: (the picked logits then the sums
    of exponentials, as one tensor; the rows whose target is outside the slice; the targets
    local to the slice)."""
    logits.sub_(row_max.unsqueeze(-1))
    outside = (target < start) | (target >= start + logits.size(-1))
    local = torch.where(outside, 0, target - start)
    picked = logits.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
    logits.exp_()
    return torch.cat((picked, logits.sum(dim=-1))), outside, local


@megatron_ce_exp.register_fake
def _exp_fake(logits: Tensor, row_max: Tensor, target: Tensor, start: int) -> tuple[Tensor, Tensor, Tensor]:
    rows = logits.shape[0]
    return (logits.new_empty((2 * rows,), dtype=torch.float32), target.new_empty((rows,), dtype=torch.bool),
            torch.empty_like(target))


@torch.library.custom_op("nnperf::megatron_ce_softmax", mutates_args=("exponentials",))
def megatron_ce_softmax(exponentials: Tensor, picked_and_sums: Tensor) -> Tensor:
    """``calculate_cross_entropy_loss``: the softmax in place of the exponentials, and the loss."""
    picked, sums = picked_and_sums.chunk(2)
    exponentials.div_(sums.unsqueeze(-1))
    return torch.log(sums) - picked


@megatron_ce_softmax.register_fake
def _softmax_fake(exponentials: Tensor, picked_and_sums: Tensor) -> Tensor:
    return exponentials.new_empty(exponentials.shape[:-1])


@torch.library.custom_op("nnperf::megatron_ce_gradient", mutates_args=("softmax",))
def megatron_ce_gradient(softmax: Tensor, grad_loss: Tensor, outside: Tensor, local: Tensor,
                         dtype: torch.dtype) -> Tensor:
    """``calculate_gradients``: the logits' gradient, in place of the softmax, cast to ``dtype``."""
    rows = torch.arange(softmax.size(0), device=softmax.device)
    softmax[rows, local] -= 1.0 - outside.float()
    softmax.mul_(grad_loss.unsqueeze(-1))
    return softmax.to(dtype, copy=True)


@megatron_ce_gradient.register_fake
def _gradient_fake(softmax: Tensor, grad_loss: Tensor, outside: Tensor, local: Tensor, dtype: torch.dtype) -> Tensor:
    return torch.empty_like(softmax, dtype=dtype)


class FusedVocabParallelCrossEntropy(torch.autograd.Function):
    """Megatron-Core's fused ``_VocabParallelCrossEntropy``: per-token losses of the local
    vocabulary slice ``[start, start + local columns)`` (``group``: the tensor-parallel group;
    None without tensor parallelism)."""

    @staticmethod
    def forward(ctx: Any, logits: Tensor, target: Tensor, start: int, group: Any) -> Tensor:
        copy, row_max = torch.ops.nnperf.megatron_ce_max(logits)
        if group is not None:
            dist.all_reduce(row_max, op=dist.ReduceOp.MAX, group=group)
        picked_and_sums, outside, local = torch.ops.nnperf.megatron_ce_exp(copy, row_max, target, start)
        if group is not None:  # one all-reduce for both (Megatron-Core's torch.cat)
            dist.all_reduce(picked_and_sums, op=dist.ReduceOp.SUM, group=group)
        loss = torch.ops.nnperf.megatron_ce_softmax(copy, picked_and_sums)
        ctx.save_for_backward(copy, outside, local)
        ctx.dtype = logits.dtype
        return loss

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor) -> tuple[Tensor, None, None, None]:
        softmax, outside, local = ctx.saved_tensors
        return torch.ops.nnperf.megatron_ce_gradient(softmax, grad_loss, outside, local, ctx.dtype), None, None, None


__all__ = ["FusedVocabParallelCrossEntropy"]
