"""Megatron-LM's cross entropy over logits split across the vocabulary, for Megatron-LM's layouts.

Why it is not PyTorch's: torchtitan's loss parallelism (``loss_parallel()``) runs DTensor's
log-softmax and NLL over the local vocabulary slice, which keeps several tensors of the logits'
size alive (an fp32 log-softmax kept for backward, and in backward a zero-filled gradient, the
log-softmax's gradient and its cast back). Megatron-Core's ``vocab_parallel_cross_entropy``
(megatron/core/tensor_parallel/cross_entropy.py, ``_VocabParallelCrossEntropy``) upcasts the
logits once and then works in place: it subtracts the rows' maxima, exponentiates, divides by
the sums and keeps that softmax for backward, where it becomes the gradient in place (the
picked entries less one, times the output gradient). With a 256k-token vocabulary that is the
difference between fitting and not fitting Nemotron-4's layouts on 80 GB.

Its three all-reduces over the tensor-parallel group are Megatron's too: the rows' maxima
(MAX), the picked logits and the sums of exponentials (SUM), one fp32 per token each.

Megatron-Core runs this function without tensor parallelism too (a group of one: no
all-reduce), so a Megatron-LM layout pays the fp32 copy and the in-place passes at any degree.

``MegatronCrossEntropy`` is a ``TorchFunctionMode`` that runs this function for every
``F.cross_entropy`` over logits split by vocabulary columns (a ``DTensor`` sharded on its last
dimension over the tensor-parallel mesh; or whole, plain logits, without tensor parallelism)
with class-index targets, no class weights and no label
smoothing; any other call runs as written (loss parallelism stays on beside it). The loss comes
back as a plain tensor (Megatron's is); its gradient reaches the logits' ``DTensor`` through
``to_local``. The mean over the targets not ignored is the caller's ``loss_mask`` average.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

from nnperf.layout import Execution
from nnperf.trace.loss import CROSS_ENTROPY_PARAMS, REDUCTIONS, is_dtensor
from nnperf.trace.options import TraceOptions
from nnperf.trace.parallel.fused_vocab_parallel_loss import FusedVocabParallelCrossEntropy
from nnperf.trace.parallel.tensor import shard_start


def runs_megatron_loss(execution: Execution, options: TraceOptions) -> bool:
    """Whether the layout's loss runs as Megatron-Core's, the loss run as written: Megatron-LM's
    layouts, whose language models call ``vocab_parallel_cross_entropy`` whatever the
    tensor-parallel degree (megatron/core/models/common/language_module/language_module.py,
    ``compute_language_model_loss``; fused with --cross-entropy-loss-fusion,
    ``Execution.loss_fusion``): over the whole vocabulary without tensor parallelism, over the
    logits' vocabulary slice with it."""
    if not execution.megatron_layout or options.loss != "eager":
        return False
    return execution.tensor == 1 or execution.splits_logits


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Megatron-Core's ``_VocabParallelCrossEntropy`` without label smoothing: per-token losses
    of the local vocabulary slice ``[start, start + local columns)``."""

    @staticmethod
    def forward(ctx: Any, logits: Tensor, target: Tensor, start: int, group: Any) -> Tensor:
        # the one fp32 copy (Megatron works on fp32 logits in place: autograd forbids that on
        # ``to_local``'s view, so they are copied too)
        logits = logits.to(torch.float32, copy=True)
        row_max = torch.max(logits, dim=-1)[0]
        if group is not None:  # a tensor-parallel group of one reduces nothing
            dist.all_reduce(row_max, op=dist.ReduceOp.MAX, group=group)
        logits -= row_max.unsqueeze(-1)
        outside = (target < start) | (target >= start + logits.size(-1))
        local_target = target.clone() - start
        local_target[outside] = 0
        rows = torch.arange(logits.size(0), device=logits.device)
        picked = logits[rows, local_target].clone().contiguous()
        picked[outside] = 0.0
        torch.exp(logits, out=logits)
        sum_exp = logits.sum(dim=-1)
        if group is not None:
            dist.all_reduce(picked, op=dist.ReduceOp.SUM, group=group)
            dist.all_reduce(sum_exp, op=dist.ReduceOp.SUM, group=group)
        loss = torch.log(sum_exp) - picked
        logits.div_(sum_exp.unsqueeze(-1))  # the softmax, kept for backward
        ctx.save_for_backward(logits, outside, local_target)
        return loss

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor) -> tuple[Tensor, None, None, None]:
        softmax, outside, local_target = ctx.saved_tensors
        rows = torch.arange(softmax.size(0), device=softmax.device)
        softmax[rows, local_target] -= 1.0 - outside.float()
        softmax.mul_(grad_loss.unsqueeze(-1))
        return softmax, None, None, None


def vocab_parallel_cross_entropy(logits: Any, target: Tensor, ignore_index: int = -100,
                                 reduction: str = "mean", fused: bool = False) -> Tensor:
    """``F.cross_entropy(logits, target)`` of (N, V) logits split by vocabulary columns over a
    1-D mesh (or whole, a plain tensor: no tensor parallelism), as Megatron-Core computes it
    (module docstring; ``fused``: its --cross-entropy-loss-fusion,
    ``trace.parallel.fused_vocab_parallel_loss``): a plain tensor."""
    if is_dtensor(logits):
        mesh = logits.device_mesh
        local, start, group = logits.to_local(), shard_start(logits.shape[-1], mesh), mesh.get_group()
    else:
        local, start, group = logits, 0, None
    if is_dtensor(target):
        target = target.full_tensor()
    function = FusedVocabParallelCrossEntropy if fused else _VocabParallelCrossEntropy
    per_token = function.apply(local, target, start, group)
    keep = target != ignore_index
    per_token = torch.where(keep, per_token, 0.0)
    if reduction == "none":
        return per_token
    if reduction == "sum":
        return per_token.sum()
    return per_token.sum() / keep.sum()


class MegatronCrossEntropy(TorchFunctionMode):
    """Runs ``F.cross_entropy`` over vocabulary-split logits (``whole``: over whole ones, the
    layout has no tensor parallelism) as Megatron-Core does (module docstring; ``fused``: its
    fused function); any other call as written."""

    def __init__(self, whole: bool = False, fused: bool = False) -> None:
        super().__init__()
        self.whole = whole
        self.fused = fused

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.cross_entropy:
            bound = dict(zip(CROSS_ENTROPY_PARAMS, args, strict=False)) | kwargs
            if _megatron_applies(bound, self.whole):
                return vocab_parallel_cross_entropy(bound["input"], bound["target"],
                                                    int(bound.get("ignore_index", -100)),
                                                    str(bound.get("reduction", "mean")), self.fused)
        return func(*args, **kwargs)


def _megatron_applies(bound: dict[str, Any], whole: bool) -> bool:
    """Whether Megatron's function computes this call: (N, V) logits sharded by columns over one
    mesh dimension (``whole``: plain ones), class-index targets, nothing Megatron's unfused
    function leaves out."""
    from torch.distributed.tensor import Shard

    logits, target = bound["input"], bound["target"]
    if logits.dim() != 2 or is_dtensor(logits) == whole:
        return False
    if not whole and (logits.device_mesh.ndim != 1 or logits.placements not in ((Shard(1),), (Shard(-1),))):
        return False
    if target.is_floating_point() or target.dim() != 1:
        return False
    return (bound.get("weight") is None and bound.get("size_average") is None and bound.get("reduce") is None
            and not bound.get("label_smoothing") and bound.get("reduction", "mean") in REDUCTIONS)

