"""``--loss compiled``: cross entropy as one fused op each way, keeping what inductor keeps.

The fused op's values and gradients are checked against eager ``F.cross_entropy``; what it saves
for backward against AOTAutograd with inductor's partitioner and decompositions (the reference
of what a compiled loss keeps); the traced step's bytes and memory by hand."""

from __future__ import annotations

import shutil
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nnperf.analysis import analyze
from nnperf.errors import UsageError
from nnperf.passes.memory.model import classify, saved_activations_by_module
from nnperf.trace.loss import CompiledLoss
from nnperf.trace.options import TraceOptions

N, V = 12, 40
NO_COMPILER = shutil.which("cc") is None and shutil.which("gcc") is None


def _fused(x, t, **kw):
    loss, *_ = torch.ops.nnperf.cross_entropy(x, t, kw.get("ignore_index", -100), kw.get("reduction", "mean"),
                                              kw.get("label_smoothing", 0.0))
    return loss


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fused_op_computes_cross_entropy_and_its_gradient(reduction, label_smoothing, dtype):
    torch.manual_seed(0)
    x = torch.randn(N, V).to(dtype)
    t = torch.randint(0, V, (N,))
    t[3] = t[7] = -100  # ignored rows
    kw = {"reduction": reduction, "label_smoothing": label_smoothing}
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    ours = _fused(x1, t, **kw)
    eager = F.cross_entropy(x2.float(), t, **kw)  # the reference computes in fp32, as inductor does
    torch.testing.assert_close(ours, eager, rtol=1e-5, atol=1e-5)
    g = torch.rand_like(ours)
    ours.backward(g)
    eager.backward(g)
    assert x1.grad.dtype == dtype  # the gradient in the logits' dtype, no fp32 copy
    torch.testing.assert_close(x1.grad, x2.grad)
    assert not x1.grad[3].any() and not x1.grad[7].any()


def _saved(fn, *args):
    """(shape, dtype) of every tensor autograd saves while ``fn`` runs forward."""
    saved = []

    def pack(t):
        saved.append((tuple(t.shape), t.dtype))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args)
    return Counter(saved)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_it_saves_what_inductors_partitioner_saves(reduction, label_smoothing):
    """torch.compile's training graphs are split by ``min_cut_rematerialization_partition`` over
    inductor's decompositions: running that here (with no code generation) gives the tensors
    a compiled loss keeps for backward."""
    from functorch.compile import aot_function, make_boxed_func, min_cut_rematerialization_partition
    from torch._inductor.decomposition import select_decomp_table

    def loss(x, t):
        return F.cross_entropy(x.float(), t, reduction=reduction, label_smoothing=label_smoothing)

    def keep(gm, _example_inputs):
        return make_boxed_func(gm)

    compiled = aot_function(loss, fw_compiler=keep, bw_compiler=keep,
                            partition_fn=min_cut_rematerialization_partition,
                            decompositions=select_decomp_table())
    x = torch.randn(N, V, dtype=torch.bfloat16, requires_grad=True)
    t = torch.randint(0, V, (N,))
    reference = _saved(compiled, x, t)
    ours = _saved(lambda x, t: _fused(x, t, reduction=reduction, label_smoothing=label_smoothing), x, t)

    def nbytes(c):
        return sum(n * torch.Size(s).numel() * d.itemsize for (s, d), n in c.items())

    # the logits in bf16 and the targets, never an fp32 tensor of the logits' size
    assert reference[((N, V), torch.bfloat16)] == ours[((N, V), torch.bfloat16)] == 1
    assert nbytes(ours) == nbytes(reference)


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(V, 16)
        self.output = nn.Linear(16, V, bias=False)

    def forward(self, tokens):
        return self.output(self.embed(tokens))


B, T = 2, 6


def _lm(loss="eager", loss_fn=None):
    targets = torch.randint(0, V, (B * T,))
    loss_fn = loss_fn or (lambda logits: F.cross_entropy(logits.flatten(0, 1), targets))
    return analyze(TinyLM(), inputs=(torch.randint(0, V, (B, T)),), loss_fn=loss_fn, amp="bf16",
                   optimizer="sgd", loss=loss)


def test_a_compiled_loss_traces_one_fused_op_each_way():
    a = _lm("compiled")
    loss_ops = [o for o in a.ops if o.module == "(loss)" or o.op.startswith("nnperf.cross")]
    names = [o.op for o in loss_ops]
    assert "nnperf.cross_entropy" in names and "nnperf.cross_entropy_backward" in names
    assert not {e.name for e in a.trace.events} & {"aten._log_softmax", "aten.nll_loss_forward",
                                                   "aten._log_softmax_backward_data"}
    fwd = next(o for o in loss_ops if o.op == "nnperf.cross_entropy")
    bwd = next(o for o in loss_ops if o.op == "nnperf.cross_entropy_backward")
    rows = B * T
    # forward reads the bf16 logits and int64 targets once; writes loss, row max, log-sum, count
    # and the rows' mask (bool)
    assert fwd.bytes_in == rows * V * 2 + rows * 8
    assert fwd.bytes_out == 4 + rows * 4 + rows * 4 + 4 + rows
    assert fwd.flops == 4 * rows * V + 3 * rows
    # backward reads the upstream gradient, logits, targets, row statistics and count, writes bf16
    assert bwd.bytes_in == 4 + rows * V * 2 + rows * 8 + 2 * rows * 4 + 4
    assert bwd.bytes_out == rows * V * 2
    assert bwd.phase == "backward"


def _saved_by_module(a) -> dict[str, int]:
    return saved_activations_by_module(a.trace, classify(a.trace))


def test_the_compiled_loss_keeps_no_copy_of_the_logits():
    rows = B * T
    eager, compiled = _saved_by_module(_lm("eager")), _saved_by_module(_lm("compiled"))
    # eager under CUDA autocast: cross_entropy asks log_softmax for the input's dtype (bf16, kept
    # for its backward), then NLL, on autocast's fp32 list, keeps its fp32 copy of that; the loss
    # and NLL's total weight are 0-d fp32
    assert eager["(loss)"] == rows * V * 2 + rows * V * 4 + 4 + 4
    # compiled: the row maximum and log-sum, the count and the loss (fp32); the bf16 logits it
    # keeps are the output projection's, which the training loop holds through backward anyway
    assert compiled["(loss)"] == 2 * rows * 4 + 4 + 4
    assert compiled["output"] == eager["output"]


def test_a_cross_entropy_inductor_would_not_fuse_here_is_traced_eagerly_and_said():
    targets = torch.randint(0, V, (B * T,))
    weight = torch.rand(V)
    a = _lm("compiled", lambda logits: F.cross_entropy(logits.flatten(0, 1), targets, weight=weight))
    assert "aten._log_softmax" in {e.name for e in a.trace.events}
    assert any("class weights" in s and "eagerly" in s for s in a.trace.config["assumptions"])


def test_a_loss_without_cross_entropy_is_refused():
    with pytest.raises(UsageError, match="--loss compiled changes nothing here"):
        _lm("compiled", lambda logits: logits.float().pow(2).mean())


def test_inference_has_no_loss_to_compile():
    with pytest.raises(UsageError, match="inference"):
        TraceOptions(train=False, loss="compiled").validate()
    with pytest.raises(UsageError, match="valid: eager, compiled, chunked, chunked-compiled"):
        TraceOptions(loss="fused").validate()


@pytest.mark.skipif(NO_COMPILER, reason="inductor's CPU code generation needs a C compiler")
def test_outside_a_trace_the_loss_is_really_compiled():
    torch._dynamo.reset()
    x = torch.randn(N, V, requires_grad=True)
    t = torch.randint(0, V, (N,))
    loss = CompiledLoss(lambda logits: F.cross_entropy(logits, t))
    torch.testing.assert_close(loss(x), F.cross_entropy(x, t))
    assert loss._compiled is not None


# --- --loss chunked: torchtitan's chunked loss over a built-in decoder ---

TINY = {"n_layer": 1, "dim": 16, "n_heads": 2, "ffn_hidden": 32, "vocab": 64}


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=pytest.mark.skipif(
    NO_COMPILER, reason="outside a trace the inner loss is compiled: inductor's CPU code needs a C compiler"))])
def test_the_chunked_loss_gives_eager_cross_entropys_loss_and_gradients(compiled):
    from nnperf.trace.loss import ChunkedLoss
    from nnperf.zoo.llama import build

    torch.manual_seed(0)
    eager = build(2, 8, **TINY)
    chunked = build(2, 8, **TINY)
    chunked.model.load_state_dict(eager.model.state_dict())
    chunked.loss_fn.targets.copy_(eager.loss_fn.targets)
    chunked.inputs = eager.inputs
    expected = eager.loss_fn(eager.model(*eager.inputs))
    expected.backward()
    loss_fn = ChunkedLoss(chunked.loss_fn, chunked.model, chunks=4, compiled=compiled)
    got = loss_fn(chunked.model(*chunked.inputs))
    got.backward()
    torch.testing.assert_close(got, expected)
    for (name, p), q in zip(chunked.model.named_parameters(), eager.model.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=name)


def _decoder(loss):
    return analyze("llama-7b", batch=2, seq_len=16, amp="bf16", optimizer="sgd", loss=loss, **TINY)


def test_a_chunked_loss_keeps_no_logits_and_runs_the_same_projection_work():
    tokens, dim, vocab, chunks = 2 * 16, TINY["dim"], TINY["vocab"], 8
    eager, chunked = _decoder("eager"), _decoder("chunked")

    def gemm_flops(a):
        return sum(o.flops for o in a.ops if o.category == "matmul")

    assert gemm_flops(chunked) == gemm_flops(eager)  # chunks split the projection, not its work
    projections = [e for e in chunked.trace.events if e.module == "(loss)" and e.name in ("aten.mm", "aten.addmm")]
    # per chunk: logits, the hidden states' gradient and the weight's gradient
    assert len(projections) == 3 * chunks
    assert all(e.outputs[0].shape in ((tokens // chunks, vocab), (tokens // chunks, dim), (vocab, dim))
               for e in projections)
    saved = _saved_by_module(chunked)
    # what backward gets from the loss: the fp32 gradient buffer of the hidden states (torchtitan's
    # GradAccumulator) and the loss; the weight's gradient, made in the loss too, becomes the
    # parameter's .grad (autograd keeps the tensor it is handed) and counts as a gradient
    assert saved["(loss)"] == tokens * dim * 4 + 4
    assert "output" not in saved  # the model's forward stopped at the final norm


def test_a_chunked_loss_needs_a_decoder_it_can_take_the_projection_of():
    with pytest.raises(UsageError, match="a chunked loss needs a built-in decoder"):
        analyze("mlp", loss="chunked")
    with pytest.raises(UsageError, match="do not split into 8 equal chunks"):
        analyze("llama-7b", batch=1, seq_len=12, loss="chunked", **TINY)
