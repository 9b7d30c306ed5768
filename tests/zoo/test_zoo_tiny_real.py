"""Tiny configurations of every family run forward + backward on real CPU tensors."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from nnperf.zoo import _attention, get_model, llama

TINY_LM = {"n_layer": 2, "n_embd": 32, "n_head": 4, "vocab": 101}
TINY = [
    ("mlp", 4, None, {"widths": "16,32,10"}),
    ("mnist-cnn", 2, None, {}),
    ("alexnet-caffe", 1, None, {"num_classes": 10}),
    ("resnet18", 2, None, {"num_classes": 10, "image_size": 32}),
    ("resnet50", 2, None, {"num_classes": 10, "image_size": 32}),
    ("mobilenet_v2", 2, None, {"num_classes": 10, "image_size": 32}),
    ("vit_b_16", 2, None, {"n_layer": 2, "n_embd": 32, "n_head": 4, "mlp_dim": 64,
                           "patch_size": 8, "image_size": 32, "num_classes": 10}),
    ("bert-base", 2, 16, {**TINY_LM, "intermediate": 64, "max_positions": 32}),
    ("gpt2", 2, 16, {**TINY_LM, "n_positions": 32}),
    ("gpt2-xl", 2, 16, {**TINY_LM, "n_positions": 32}),
    ("llama-7b", 2, 16, {"n_layer": 2, "dim": 32, "n_heads": 4, "ffn_hidden": 64, "vocab": 101}),
    ("llama-7b", 2, 16, {"n_layer": 2, "dim": 32, "n_heads": 4, "n_kv_heads": 2,
                         "ffn_hidden": 64, "vocab": 101}),
    ("deepseek-v3-16b", 2, 16, {"n_layer": 2, "dim": 32, "n_heads": 4, "kv_lora": 16, "qk_nope_dim": 8,
                                "qk_rope_dim": 4, "v_head_dim": 8, "ffn_hidden": 64, "moe_hidden": 16,
                                "n_experts": 4, "top_k": 2, "vocab": 101}),
]  # fmt: skip


@pytest.mark.parametrize(("name", "batch", "seq", "overrides"), TINY, ids=lambda v: str(v))
def test_forward_backward_real(name, batch, seq, overrides) -> None:
    torch.manual_seed(0)
    w = get_model(name).build(batch, seq, **overrides)
    loss = w.loss_fn(w.model(*w.inputs))
    assert loss.dim() == 0 and math.isfinite(loss.item())
    loss.backward()
    missing = [n for n, p in w.model.named_parameters() if p.grad is None]
    assert not missing, f"parameters the loss does not reach: {missing}"
    assert w.samples == batch
    assert w.tokens == (None if seq is None else batch * seq)


def test_initial_lm_loss_is_near_uniform() -> None:
    """A sensible init: next-token loss starts close to log(vocab)."""
    torch.manual_seed(0)
    w = get_model("gpt2").build(2, 16, **TINY_LM, n_positions=32)
    w.model.eval()
    assert abs(w.loss_fn(w.model(*w.inputs)).item() - math.log(101)) < 0.5


def test_gqa_matches_repeated_kv(monkeypatch) -> None:
    """SDPA's enable_gqa and the older-torch repeat_interleave fallback agree."""
    torch.manual_seed(0)
    w = get_model("llama-7b").build(
        1, 8, n_layer=1, dim=32, n_heads=4, n_kv_heads=2, ffn_hidden=64, vocab=50
    )
    w.model.eval()
    with torch.no_grad():
        native = w.model(*w.inputs)
        monkeypatch.setattr(_attention, "SDPA_HAS_GQA", False)
        fallback = w.model(*w.inputs)
    torch.testing.assert_close(native, fallback)


@pytest.mark.parametrize(
    ("name", "seq", "overrides", "causal"),
    [
        ("vit_b_16", None, {"n_layer": 3, "n_embd": 32, "n_head": 4, "mlp_dim": 64,
                            "patch_size": 8, "image_size": 32}, False),
        ("bert-base", 8, {**TINY_LM, "n_layer": 3, "intermediate": 64}, False),
        ("gpt2-medium", 8, {**TINY_LM, "n_layer": 3}, True),
        ("llama-7b", 8, {"n_layer": 3, "dim": 32, "n_heads": 4, "ffn_hidden": 64}, True),
    ],
)  # fmt: skip
def test_attention_goes_through_sdpa(monkeypatch, name, seq, overrides, causal) -> None:
    calls: list[bool] = []
    real = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append(kwargs.get("is_causal", False))
        assert kwargs.get("attn_mask") is None
        return real(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    w = get_model(name).build(1, seq, **overrides)
    w.model(*w.inputs)
    assert calls == [causal] * 3


def test_rotary_scores_depend_on_relative_position_only() -> None:
    """RoPE's defining property: q_m . k_n depends on m - n, and not only on the content."""
    torch.manual_seed(0)
    q, k = torch.randn(2, 1, 1, 1, 16).unbind(0)
    cos, sin = llama.rotary_tables(8, 16, q)
    rq = llama.apply_rotary(q.expand(1, 1, 8, 16), cos, sin)[0, 0]
    rk = llama.apply_rotary(k.expand(1, 1, 8, 16), cos, sin)[0, 0]
    scores = rq @ rk.T
    torch.testing.assert_close(scores[5, 2], scores[4, 1])
    torch.testing.assert_close(scores[7, 7], scores[0, 0])
    assert not torch.allclose(scores[5, 2], scores[2, 2])


def test_qk_norm_normalizes_each_heads_query_and_key_before_the_rotation() -> None:
    """Qwen3's q_norm and k_norm (transformers' ``Qwen3Attention``): each head's query and key
    RMS-normalized over its head_dim features, then rotated; computed here with ``F.rms_norm``
    and the module's own rotation."""
    torch.manual_seed(0)
    attention = llama.Attention(dim=32, n_heads=4, n_kv_heads=2, head_dim=16, qk_norm=True)
    with torch.no_grad():
        attention.q_norm.weight.uniform_(0.5, 1.5)
        attention.k_norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 8, 32)
    b, t, d = 2, 8, 16

    def heads(y: torch.Tensor) -> torch.Tensor:
        return y.view(b, t, -1, d).transpose(1, 2)

    q = F.rms_norm(heads(attention.wq(x)), (d,), attention.q_norm.weight, eps=llama.NORM_EPS)
    k = F.rms_norm(heads(attention.wk(x)), (d,), attention.k_norm.weight, eps=llama.NORM_EPS)
    cos, sin = llama.rotary_tables(t, d, q)
    q, k = llama.apply_rotary(q, cos, sin), llama.apply_rotary(k, cos, sin)
    v = heads(attention.wv(x))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    expected = attention.wo(out.transpose(1, 2).reshape(b, t, -1))
    torch.testing.assert_close(attention(x), expected, rtol=1e-5, atol=1e-5)
