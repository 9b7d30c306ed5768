"""Megatron-Core's fused cross entropy (``trace.parallel.fused_vocab_parallel_loss``,
``Execution.loss_fusion``): PyTorch's loss and gradients on real tensors, the bytes of its four
kernels by hand from megatron/core/fusions/fused_cross_entropy.py (N rows of V bf16 logits:
``calculate_logits_max`` reads 2NV and writes the fp32 copy, 4NV, and the maxima, 4N;
``calculate_predicted_logits`` reads the copy, the maxima and the int64 targets and writes the
copy back, the picked logits and sums, 8N, the mask, N, and the local targets, 8N;
``calculate_cross_entropy_loss`` reads the copy and the 8N and writes the copy back and the
loss, 4N; backward reads the softmax, the output gradient, the mask and the local targets and
writes the softmax back and the bf16 gradient, 2NV), and its two all-reduces over the
tensor-parallel group (the unfused function has three)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nnperf.layout import Execution
from nnperf.passes.count import count_ops
from nnperf.trace.distributed import trace_rank
from nnperf.trace.options import TraceOptions
from nnperf.trace.parallel.fused_vocab_parallel_loss import FusedVocabParallelCrossEntropy

LLAMA = {"n_layer": 1, "dim": 32, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 48, "vocab": 101}
BATCH, SEQ = 2, 16


def test_the_fused_function_computes_pytorchs_loss_and_gradient():
    torch.manual_seed(0)
    logits = torch.randn(24, 37, requires_grad=True)
    target = torch.randint(0, 37, (24,))
    loss = FusedVocabParallelCrossEntropy.apply(logits, target, 0, None)
    reference = F.cross_entropy(logits, target, reduction="none")
    torch.testing.assert_close(loss, reference)
    grad = torch.randn(24)
    (mine,) = torch.autograd.grad(loss, logits, grad)
    (theirs,) = torch.autograd.grad(reference, logits, grad)
    torch.testing.assert_close(mine, theirs)


def _trace(tensor: int, fused: bool):
    from nnperf.zoo import get_model

    execution = Execution(world=2 * tensor, data="zero1", tensor=tensor, sequence_parallel=tensor > 1,
                          micro_batch=BATCH, loss_fusion=fused)
    return trace_rank(lambda: get_model("llama-7b").build(batch=BATCH, seq_len=SEQ, **LLAMA),
                      TraceOptions(optimizer="adamw", dtype="bf16"), execution, lambda model: [])


@pytest.mark.process
@pytest.mark.parametrize("tensor", [1, 2])
def test_four_kernels_move_what_megatrons_compiled_functions_do(tensor):
    traced = _trace(tensor, fused=True)
    counts = [c for c in count_ops(traced.trace) if c.event.name.startswith("nnperf.megatron_ce_")]
    n, v = BATCH * SEQ, LLAMA["vocab"] // tensor + (LLAMA["vocab"] % tensor and 1)
    by_hand = {
        "nnperf.megatron_ce_max": 2 * n * v + 4 * n * v + 4 * n,
        "nnperf.megatron_ce_exp": (4 * n * v + 4 * n + 8 * n) + (4 * n * v + 8 * n + n + 8 * n),
        "nnperf.megatron_ce_softmax": (4 * n * v + 8 * n) + (4 * n * v + 4 * n),
        "nnperf.megatron_ce_gradient": (4 * n * v + 4 * n + n + 8 * n) + (4 * n * v + 2 * n * v),
    }
    assert {c.event.name: c.bytes for c in counts} == by_hand
    loss_reductions = [c for c in traced.collectives if c.kind == "all_reduce" and c.phase == "forward"
                       and c.group_size == tensor]
    assert [c.bytes for c in loss_reductions] == ([4 * n, 8 * n] if tensor > 1 else [])


@pytest.mark.process
def test_unfused_megatron_loss_is_left_as_it_was():
    assert not any(e.name.startswith("nnperf.megatron_ce_") for e in _trace(1, fused=False).trace.events)


def test_loss_fusion_needs_megatrons_data_parallelism():
    from nnperf.errors import UsageError

    with pytest.raises(UsageError, match="--cross-entropy-loss-fusion"):
        Execution(world=8, data="fsdp", shard=8, loss_fusion=True).validate()
