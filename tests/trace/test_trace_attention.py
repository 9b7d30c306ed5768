"""Attention is traced as one fused op forward and one backward, with costs by hand, and the
fused op's real implementation agrees with ``F.scaled_dot_product_attention``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nnperf.analysis import analyze
from nnperf.trace.attention import fused_sdpa, unfused_sdpa
from nnperf.trace.events import dtype_name

B, H, S, D = 2, 4, 16, 8


class Attend(nn.Module):
    """A projection (so there is a parameter and a backward) then one SDPA call."""

    def __init__(self, causal=False, mask=None, gqa=False):
        super().__init__()
        self.proj = nn.Linear(D, D)
        self.causal, self.gqa = causal, gqa
        self.register_buffer("mask", mask)

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(
            self.proj(q), k, v, attn_mask=self.mask, is_causal=self.causal, enable_gqa=self.gqa
        )


def _attention_ops(model, kv_heads=H):
    inputs = (torch.randn(B, H, S, D), torch.randn(B, kv_heads, S, D), torch.randn(B, kv_heads, S, D))
    a = analyze(model, inputs=inputs, optimizer="sgd")
    ops = [o for o in a.ops if o.category == "attention"]
    return a, ops


def test_sdpa_is_one_fused_op_forward_and_one_backward():
    a, ops = _attention_ops(Attend())
    assert [(o.op, o.phase) for o in ops] == [
        ("nnperf.attention", "forward"),
        ("nnperf.attention_backward", "backward"),
    ]
    # nothing of the decomposed (math) attention is left: no bmm and no softmax anywhere
    names = {e.name for e in a.trace.events}
    assert not names & {"aten.bmm", "aten._softmax", "aten._scaled_dot_product_flash_attention_for_cpu"}
    fwd, bwd = ops
    full_macs = B * H * S * S * (D + D)  # Q@K^T and P@V
    assert fwd.flops == 2 * full_macs
    assert bwd.flops == 2 * fwd.flops  # dV, dP, dQ, dK
    # forward reads q, k, v and writes the output and the fp32 row log-sum-exp
    assert fwd.bytes_in == 3 * B * H * S * D * 4
    assert fwd.bytes_out == B * H * S * D * 4 + B * H * S * 4


def test_causal_counts_kept_pairs_only():
    _, (full, _) = _attention_ops(Attend())
    _, (causal, causal_bwd) = _attention_ops(Attend(causal=True))
    kept = S * (S + 1) // 2  # top-left causal: row i keeps i + 1 keys
    assert causal.flops == 2 * B * H * kept * (D + D)
    assert causal_bwd.flops == 2 * causal.flops
    assert causal.flops / full.flops == pytest.approx(kept / (S * S))  # about half


def test_explicit_mask_is_read_but_does_not_change_flops():
    _, (plain, plain_bwd) = _attention_ops(Attend())
    mask = torch.ones(S, S, dtype=torch.bool).tril()
    _, (masked, masked_bwd) = _attention_ops(Attend(mask=mask))
    assert masked.flops == plain.flops
    assert masked_bwd.flops == plain_bwd.flops
    assert masked.bytes_in - plain.bytes_in == S * S  # one byte per bool
    assert masked_bwd.bytes_in - plain_bwd.bytes_in == S * S


def test_gqa_counts_query_head_work_and_reads_fewer_kv_bytes():
    _, (mha, _) = _attention_ops(Attend())
    _, (gqa, gqa_bwd) = _attention_ops(Attend(gqa=True), kv_heads=H // 2)
    assert gqa.flops == 2 * B * H * S * S * (D + D)  # all H query heads do the work
    assert gqa_bwd.flops == 2 * gqa.flops
    assert mha.bytes_in - gqa.bytes_in == 2 * B * (H // 2) * S * D * 4  # k and v: half the heads
    # dk and dv have the KV heads' shape
    assert gqa_bwd.bytes_out == (B * H * S * D + 2 * B * (H // 2) * S * D) * 4


def test_llama_gqa_attention_flops_by_hand():
    batch, seq, layers, heads, dim = 1, 32, 2, 4, 32
    a = analyze("llama-7b", batch=batch, seq_len=seq, optimizer="sgd", n_layer=layers, dim=dim,
                n_heads=heads, n_kv_heads=1, ffn_hidden=64, vocab=64)
    fwd = [o for o in a.ops if o.op == "nnperf.attention"]
    bwd = [o for o in a.ops if o.op == "nnperf.attention_backward"]
    assert len(fwd) == len(bwd) == layers
    head_dim = dim // heads
    per_layer = 2 * batch * heads * (seq * (seq + 1) // 2) * 2 * head_dim
    assert sum(o.flops for o in fwd) == layers * per_layer
    assert sum(o.flops for o in bwd) == 2 * layers * per_layer


# -- the fused op's real implementation ----------------------------------------------------
CASES = {
    "plain": dict(),
    "causal": dict(is_causal=True),
    "causal-rect": dict(is_causal=True, q_len=5, kv_len=9),  # top-left alignment
    "causal-rect-long-q": dict(is_causal=True, q_len=9, kv_len=5),
    "bool-mask": dict(mask="bool"),
    "float-mask": dict(mask="float"),
    "gqa": dict(enable_gqa=True, kv_heads=2),
    "gqa-causal-scale": dict(enable_gqa=True, kv_heads=1, is_causal=True, scale=0.3),
}


@pytest.mark.parametrize("case", list(CASES))
def test_fused_sdpa_matches_pytorch_forward_and_gradients(case):
    c = dict(CASES[case])
    q_len, kv_len, kv_heads = c.pop("q_len", 7), c.pop("kv_len", 7), c.pop("kv_heads", 4)
    mask_kind = c.pop("mask", None)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, q_len, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, kv_heads, kv_len, 8, generator=g, dtype=torch.float64)
    v = torch.randn(2, kv_heads, kv_len, 6, generator=g, dtype=torch.float64)
    if mask_kind == "bool":
        c["attn_mask"] = torch.rand(q_len, kv_len, generator=g) > 0.3
        c["attn_mask"][:, 0] = True  # no fully masked row (NaN in both)
    elif mask_kind == "float":
        c["attn_mask"] = torch.randn(2, 1, q_len, kv_len, generator=g, dtype=torch.float64)
    results = []
    for fn in (F.scaled_dot_product_attention, fused_sdpa, unfused_sdpa):
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        out = fn(qq, kk, vv, **c)
        grad_out = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)
        out.backward(grad_out)
        results.append((out, qq.grad, kk.grad, vv.grad))
        if fn is fused_sdpa:  # gradients come back in their inputs' layout, as from flash
            assert (qq.grad.stride(), kk.grad.stride()) == (qq.stride(), kk.stride())
    for result in results[1:]:
        for expected, got, what in zip(results[0], result, ("out", "dq", "dk", "dv"), strict=True):
            assert got.shape == expected.shape, what
            torch.testing.assert_close(got, expected, msg=what)


def test_unfused_sdpa_is_the_unfused_kernels_in_the_input_dtype():
    """``sdpa="unfused"``: two batched GEMMs forward (scores, then values; 2*B*H*L*S*E FLOPs
    each), the causal mask, softmax and CUDA's fused dropout, all bf16 for a bf16 model; the
    fused op does not appear."""
    class Causal(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(D, D)

        def forward(self, x):
            q = self.proj(x).view(B, S, H, D // H).transpose(1, 2)
            return F.scaled_dot_product_attention(q, q, q, is_causal=True, dropout_p=0.1)

    a = analyze(Causal(), inputs=(torch.randn(B, S, D),), dtype="bf16", optimizer="sgd", sdpa="unfused")
    forward = [e for e in a.trace.events if e.phase == "forward"]
    names = [e.name for e in forward]
    assert "nnperf.attention" not in names
    assert names.count("aten.bmm") == 2
    for op in ("aten.masked_fill", "aten._softmax", "aten.native_dropout"):
        assert names.count(op) == 1, op
    assert {e.outputs[0].dtype for e in forward if e.name in ("aten.bmm", "aten._softmax")} == {torch.bfloat16}
    bmm_flops = sum(o.flops for o in a.ops if o.op == "aten.bmm" and o.phase == "forward")
    assert bmm_flops == 2 * (2 * B * H * S * S * (D // H))


def test_unfused_sdpa_on_a_step_without_sdpa_is_refused():
    """Like --channels-last without 4-D tensors: a setting that would not reach the model."""
    from nnperf.errors import UsageError

    with pytest.raises(UsageError, match=r"^--sdpa unfused changes nothing here: the step calls no "
                                         r"F\.scaled_dot_product_attention .*; leave it out$"):
        analyze(nn.Sequential(nn.Linear(D, D)), inputs=(torch.randn(B, D),), sdpa="unfused")
    attend = analyze(Attend(), inputs=(torch.randn(B, H, S, D),) * 3, sdpa="unfused")
    assert "assumptions" not in attend.config


@pytest.mark.parametrize(("autocast_device", "merge_copies"), [("cuda", 0), ("cpu", 1)])
def test_the_output_takes_the_layout_of_the_device_kernel(autocast_device, merge_copies):
    """CUDA's fused kernels write (batch, seq, heads, dim) and hand it out transposed, so GPT-2
    merging its heads (``transpose(1, 2)`` then a reshape) copies nothing; the CPU's kernel
    returns (batch, heads, seq, dim)-contiguous and the merge copies (checked against
    F.scaled_dot_product_attention on this CPU below)."""
    from nnperf.trace.capture import trace_workload
    from nnperf.trace.options import TraceOptions
    from nnperf.zoo import get_model

    q = torch.randn(B, H, S, D)
    assert F.scaled_dot_product_attention(q, q, q, is_causal=True).is_contiguous()
    trace, _ = trace_workload(lambda: get_model("gpt2").build(batch=B, seq_len=S, n_layer=1),
                              TraceOptions(autocast_device=autocast_device))
    fused = next(e for e in trace.events if e.name == "nnperf.attention")
    _, h, s, d = fused.outputs[0].shape
    expected = (s * h * d, d, h * d, 1) if autocast_device == "cuda" else (h * s * d, s * d, d, 1)
    assert fused.outputs[0].stride == expected
    copies = [e for e in trace.events if e.name == "aten.clone" and e.phase == "forward" and "attn" in e.module]
    assert len(copies) == merge_copies


class _SelfAttention(nn.Module):
    """``nn.MultiheadAttention`` as models call it: weights asked for (its default) or not."""

    def __init__(self, need_weights: bool):
        super().__init__()
        self.attn = nn.MultiheadAttention(E, HEADS, batch_first=True, dropout=0.1)
        self.need_weights = need_weights

    def forward(self, x):
        return self.attn(x, x, x, need_weights=self.need_weights)[0]


E, HEADS, T = 64, 4, 32


def _matrix_ops(model, amp="bf16", train=True):
    a = analyze(model, inputs=(torch.randn(B, T, E),), optimizer="sgd", amp=amp, train=train)
    return a, [(o.op, o.phase, dtype_name(o.event.inputs[0].dtype)) for o in a.ops
               if o.category in ("gemm", "attention")]


@pytest.mark.parametrize("train", [True, False])
def test_transformer_encoder_layer_attends_with_the_fused_kernel_in_bf16(train):
    """``nn.TransformerEncoderLayer`` calls ``F.multi_head_attention_forward`` with
    ``need_weights=False``, which runs SDPA: on a GPU one fused kernel in bf16 under bf16
    autocast (the fast path is off under autocast: activation.py). Before, the trace held the
    CPU's math attention, its batched GEMMs in fp32."""
    layer = nn.TransformerEncoderLayer(E, HEADS, dim_feedforward=128, batch_first=True)
    a, ops = _matrix_ops(layer, train=train)
    attention = [op for op in ops if op[0].startswith("nnperf.attention")]
    assert attention == [("nnperf.attention", "forward", "bf16")] + (
        [("nnperf.attention_backward", "backward", "bf16")] if train else [])
    assert {dtype for _, _, dtype in ops} == {"bf16"}
    names = {e.name for e in a.trace.events}
    assert not names & {"aten._safe_softmax", "aten._softmax", "aten.bernoulli_"}
    # no score matrix: the only batched GEMM is the in-projection of the (seq, batch, E) view
    # against the broadcast weight, as at::linear runs a non-contiguous 3-D input on any device
    scores = [e for e in a.trace.events if any(m.shape[-2:] == (T, T) for m in e.outputs)]
    assert scores == []
    fwd = next(o for o in a.ops if o.op == "nnperf.attention")
    assert fwd.flops == 2 * B * HEADS * T * T * (2 * (E // HEADS))  # Q@K^T and P@V, every pair


def test_attention_dropout_inside_multihead_attention_is_the_gpus_native_dropout():
    """The attention weights' dropout of ``need_weights=True`` is CUDA's one ``native_dropout``
    kernel, not the CPU's bernoulli_/div_/mul."""
    a, ops = _matrix_ops(_SelfAttention(need_weights=True))
    names = [e.name for e in a.trace.events]
    assert "aten.native_dropout" in names
    assert not {"aten.bernoulli_", "aten.div_"} & set(names)
    # the score matrix is computed as written (bmm, softmax, bmm), the GEMMs in bf16 as autocast casts them
    assert [op for op in ops if op[0] == "aten.bmm" and op[1] == "forward"] == [("aten.bmm", "forward", "bf16")] * 2
    assert not any(op[0].startswith("nnperf.attention") for op in ops)


def test_multihead_attention_without_weights_is_fused_attention():
    _, ops = _matrix_ops(_SelfAttention(need_weights=False))
    assert [op for op in ops if op[0].startswith("nnperf.attention")] == [
        ("nnperf.attention", "forward", "bf16"), ("nnperf.attention_backward", "backward", "bf16")]
    # the functional module is left as it was found
    assert F.scaled_dot_product_attention is torch._C._nn.scaled_dot_product_attention


def test_an_encoder_under_bf16_autocast_reports_mfu_against_the_bf16_peak():
    """Its attention ran as fp32 batched GEMMs in the trace, so MFU was taken against a peak
    mixed of bf16 and fp32 (471 of H100's 989 TFLOP/s for a 2-layer encoder)."""
    from nnperf.hardware import load_gpu
    from nnperf.prediction import predict_analysis

    gpu = load_gpu("h100")
    layer = nn.TransformerEncoderLayer(E, HEADS, dim_feedforward=128, batch_first=True)
    a = analyze(layer, inputs=(torch.randn(B, T, E),), optimizer="sgd", amp="bf16")
    totals = predict_analysis(a, gpu).totals
    assert totals["mfu_math"] == "bf16"
    assert totals["mfu_peak_flops"] == pytest.approx(gpu.tensor_tflops["bf16"] * 1e12)  # the datasheet peak
