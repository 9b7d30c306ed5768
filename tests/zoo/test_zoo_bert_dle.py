"""BERT-large as NVIDIA DeepLearningExamples builds it (pre-training and SQuAD heads).

Expected counts: Hugging Face's bert-large-uncased ``BertModel`` has 335,141,888 parameters
(derived by hand below); DLE pads the vocabulary to 30528, adding 6 x 1024. The head counts
are DLE's ``BertForPreTraining`` / ``BertForQuestionAnswering`` (modeling.py at a07d20a1)
instantiated and counted: 336,232,258 and 335,150,082.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from nnperf.analysis import analyze
from nnperf.zoo import get_model

TINY = {"n_layer": 2, "n_embd": 32, "n_head": 4, "intermediate": 64, "vocab": 97,
        "max_positions": 32}  # fmt: skip


def count(module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_parameter_counts():
    h, ffn, layers, vocab = 1024, 4096, 24, 30522
    embeddings = vocab * h + 512 * h + 2 * h + 2 * h
    layer = 4 * (h * h + h) + 2 * h + (h * ffn + ffn) + (ffn * h + h) + 2 * h
    hf_bert_large = embeddings + layers * layer + (h * h + h)
    assert hf_bert_large == 335_141_888
    with FakeTensorMode():
        pretraining = get_model("bert-large").build(1).model
        squad = get_model("bert-large-squad").build(1).model
    assert pretraining.bert.embeddings.word_embeddings.num_embeddings == 30528
    assert count(pretraining.bert) == hf_bert_large + 6 * h == 335_148_032
    # MLM transform (dense + LayerNorm), decoder bias (weight tied), NSP
    heads = (h * h + h) + 2 * h + 30528 + (2 * h + 2)
    assert count(pretraining) == 335_148_032 + heads == 336_232_258
    assert count(squad) == 335_148_032 + (2 * h + 2) == 335_150_082
    decoder = pretraining.cls.predictions.decoder
    assert decoder.weight is pretraining.bert.embeddings.word_embeddings.weight


@pytest.mark.parametrize(("seq", "masked"), [(128, 19), (512, 77)])
def test_masked_lm_runs_on_the_masked_tokens_only(seq, masked):
    """round(0.15 * seq) per full sequence (run_pretraining.sh caps them at 20 and 80)."""
    with FakeTensorMode():
        w = get_model("bert-large").build(2, seq, n_layer=1)
        mlm, nsp = w.model(*w.inputs)
    assert tuple(mlm.shape) == (2 * masked, 30528) and tuple(nsp.shape) == (2, 2)
    assert w.tokens == 2 * seq and tuple(w.inputs[0].shape) == (2, seq)


@pytest.mark.parametrize("name", ["bert-large", "bert-large-squad"])
def test_training_flops_equal_flop_counter(name, reference_training_flops):
    """Attention is two ``bmm`` per layer here (DLE's code), which FlopCounterMode counts."""
    a = analyze(name, batch=2, seq_len=16, optimizer="sgd", **TINY)
    got = sum(op.flops for op in a.ops if op.category in ("gemm", "conv", "attention"))
    assert got == reference_training_flops(name, 2, 16, **TINY)


def test_tiny_forward_backward_real():
    """Every parameter trains in pre-training; SQuAD leaves the pooler without a gradient, as
    in DLE (``BertModel`` computes it, ``BertForQuestionAnswering`` ignores it), and says so."""
    torch.manual_seed(0)
    for name, unused in [("bert-large", set()), ("bert-large-squad", {"pooler"})]:
        w = get_model(name).build(2, 16, **TINY)
        loss = w.loss_fn(w.model(*w.inputs))
        assert math.isfinite(loss.item())
        loss.backward()
        missing = {n.split(".")[1] for n, p in w.model.named_parameters() if p.grad is None}
        assert missing == unused, name
        frozen = {n.split(".")[1] for n, p in w.model.named_parameters() if not p.requires_grad}
        assert frozen == unused, name
