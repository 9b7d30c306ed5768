"""Megatron-Core's vocabulary-parallel cross entropy (``trace.parallel.vocab_parallel_loss``):
run for real on 2 gloo ranks against eager ``F.cross_entropy`` on the whole logits (loss and
gradient, 16- and 32-bit, an uneven vocabulary split, ignored targets, each reduction); and on a
traced rank of a Megatron-LM layout, its three all-reduces and what it keeps for backward,
counted by hand from Megatron's function."""

from __future__ import annotations

import pytest
import torch
from gloo_ranks import run_ranks

from nnperf.layout import Execution
from nnperf.passes.memory.model import classify, saved_activations_by_module
from nnperf.trace.distributed import trace_rank
from nnperf.trace.options import TraceOptions

WORLD = 2
ROWS, VOCAB = 6, 13  # 13 columns: slices of 7 and 6, as torch.chunk (DTensor's Shard) splits them
REDUCTIONS = ("mean", "sum", "none")
DTYPES = (torch.float32, torch.bfloat16)


def _worker(rank: int) -> dict:
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from nnperf.trace.parallel.vocab_parallel_loss import MegatronCrossEntropy

    mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("tensor",))
    out = {}
    for dtype in DTYPES:
        for reduction in REDUCTIONS:
            torch.manual_seed(0)
            logits = (torch.randn(ROWS, VOCAB) * 3).to(dtype)
            # targets in both slices, on their edges, and one ignored
            target = torch.tensor([0, 6, 7, 12, -100, 3])
            whole = logits.clone().requires_grad_()
            expected = F.cross_entropy(whole.float(), target, reduction=reduction)
            split = distribute_tensor(logits.clone(), mesh, [Shard(1)]).requires_grad_()
            with MegatronCrossEntropy():
                got = F.cross_entropy(split, target, reduction=reduction)
            upstream = torch.linspace(0.5, 1.5, got.numel()).reshape(got.shape)
            expected.backward(upstream)
            got.backward(upstream)
            grad = split.grad.full_tensor()
            out[str(dtype), reduction] = (got.detach(), expected.detach(), grad, whole.grad, type(got).__name__)
    return out


@pytest.fixture(scope="module")
def real_runs():
    return run_ranks(_worker, WORLD, timeout_s=120)


@pytest.mark.process
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_loss_and_gradient_match_eager_cross_entropy_on_every_rank(real_runs, dtype, reduction):
    for rank in range(WORLD):
        got, expected, grad, expected_grad, kind = real_runs[rank][str(dtype), reduction]
        torch.testing.assert_close(got, expected.to(got.dtype), rtol=1e-5, atol=1e-6)
        assert kind == "Tensor"  # Megatron's loss is a plain tensor, not a DTensor
        assert grad.dtype == dtype  # cast back to the logits' dtype by autograd
        tolerance = {} if dtype == torch.float32 else {"rtol": 1e-2, "atol": 1e-2}
        torch.testing.assert_close(grad.float(), expected_grad.float(), **tolerance)
        assert not grad[4].any()  # the ignored target's row


TINY = {"n_layer": 1, "dim": 16, "n_heads": 2, "n_kv_heads": 2, "ffn_hidden": 32, "vocab": 65}
BATCH, SEQ = 2, 8


def _traced(execution: Execution):
    from nnperf.zoo.llama import build

    return trace_rank(lambda: build(BATCH, SEQ, **TINY), TraceOptions(optimizer="adamw", dtype="bf16"),
                      execution, lambda model: ["layers.0"])


MEGATRON = Execution(world=4, data="zero1", tensor=WORLD, sequence_parallel=True)


def test_a_megatron_layout_reduces_three_numbers_per_token():
    """Megatron's all-reduces over the tensor-parallel group: the rows' maxima, the picked
    logits and the sums of exponentials, one fp32 per token of the micro-batch each (the output
    layer gathered the sequence first)."""
    traced = _traced(MEGATRON)
    loss_ops = [e for e in traced.trace.events if e.module == "(loss)"]
    reduces = [e for e in loss_ops if e.name == "c10d.allreduce_"]
    assert len(reduces) == 3
    tokens = BATCH * SEQ
    loss_reduces = [c for c in traced.collectives if c.kind == "all_reduce" and c.bytes == tokens * 4]
    assert len(loss_reduces) == 3
    assert not any(e.name.startswith("aten._log_softmax") for e in loss_ops)


def test_it_keeps_one_fp32_softmax_of_the_local_slice_for_backward():
    """Saved for backward: the softmax (fp32, the rank's 33 of 65 columns, written in place over
    the one upcast copy), which rows' targets lie outside the slice (bool) and the targets made
    local (int64), as ``_VocabParallelCrossEntropy`` saves them; then the mean over the targets
    not ignored keeps its mask (bool) and count (a 0-d int64); and the loss itself (0-d fp32)."""
    tokens, local_vocab = BATCH * SEQ, -(-TINY["vocab"] // WORLD)
    trace = _traced(MEGATRON).trace
    saved = saved_activations_by_module(trace, classify(trace))["(loss)"]
    assert saved == tokens * local_vocab * 4 + tokens + tokens * 8 + tokens + 8 + 4


def test_torchtitans_layouts_keep_pytorchs_loss_parallel():
    """FSDP beside tensor parallelism is torchtitan's layout: DTensor's loss-parallel log-softmax
    and NLL, not Megatron's function."""
    traced = _traced(Execution(world=4, data="fsdp", shard=2, tensor=WORLD, sequence_parallel=True))
    names = {e.name for e in traced.trace.events if e.module == "(loss)"}
    assert "c10d.allreduce_" not in names and "_c10d_functional.all_reduce" in names


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_whole_logits_match_eager_cross_entropy(reduction):
    """Without tensor parallelism Megatron-Core runs the same function over the whole
    vocabulary: loss and gradient as eager ``F.cross_entropy`` (bf16 logits, an ignored target)."""
    import torch.nn.functional as F

    from nnperf.trace.parallel.vocab_parallel_loss import MegatronCrossEntropy

    torch.manual_seed(0)
    logits = (torch.randn(ROWS, VOCAB) * 3).to(torch.bfloat16)
    target = torch.tensor([0, 6, 7, 12, -100, 3])
    whole, plain = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    expected = F.cross_entropy(whole.float(), target, reduction=reduction)
    with MegatronCrossEntropy(whole=True):
        got = F.cross_entropy(plain, target, reduction=reduction)
    upstream = torch.linspace(0.5, 1.5, got.numel()).reshape(got.shape)
    expected.backward(upstream)
    got.backward(upstream)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(plain.grad.float(), whole.grad.float(), rtol=1e-2, atol=1e-2)
    assert not plain.grad[4].any()


def test_a_megatron_layout_without_tensor_parallelism_runs_megatrons_loss():
    """ZeRO-1 alone is Megatron-LM's layout: its loss is ``vocab_parallel_cross_entropy`` over
    the whole vocabulary (no all-reduce: a group of one), keeping the fp32 softmax of all 65
    columns, the outside-the-slice mask, the targets, the mean's mask and count, and the loss."""
    traced = _traced(Execution(world=2, data="zero1"))
    loss_ops = [e for e in traced.trace.events if e.module == "(loss)"]
    assert not any(e.name.startswith("aten._log_softmax") or "all_reduce" in e.name or "allreduce" in e.name
                   for e in loss_ops)
    tokens = BATCH * SEQ
    saved = saved_activations_by_module(traced.trace, classify(traced.trace))["(loss)"]
    assert saved == tokens * TINY["vocab"] * 4 + tokens + tokens * 8 + tokens + 8 + 4


def test_fsdp_alone_keeps_pytorchs_cross_entropy():
    """FSDP without tensor parallelism is torchtitan's layout: PyTorch's log-softmax and NLL."""
    traced = _traced(Execution(world=2, data="fsdp", shard=2))
    assert any(e.name.startswith("aten._log_softmax") for e in traced.trace.events if e.module == "(loss)")
