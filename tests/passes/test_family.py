"""The model family read from a trace, on tiny networks built here whose family is known by
construction (each a few layers, traced for inference on fake tensors)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nnperf import analyze
from nnperf.passes.family import trace_family


def family(model: nn.Module, *inputs: torch.Tensor) -> str:
    a = analyze(model, inputs=inputs, train=False)
    return trace_family(a.trace, a.ops)


class Attention(nn.Module):
    """One head of scaled-dot-product self-attention; ``causal`` as SDPA's ``is_causal``."""

    def __init__(self, dim: int, causal: bool, mask: bool = False, eager: bool = False) -> None:
        super().__init__()
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.causal, self.mask, self.eager = causal, mask, eager

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).unsqueeze(1).chunk(3, dim=-1)  # (batch, 1 head, length, dim)
        if self.eager:
            scores = torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-1)
            return self.out((scores @ v).squeeze(1))
        length = x.shape[1]
        mask = torch.ones(length, length, dtype=torch.bool, device=x.device).tril() if self.mask else None
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal)
        return self.out(y.squeeze(1))


class TokenModel(nn.Module):
    def __init__(self, causal: bool = False, mask: bool = False, eager: bool = False, vocab: int = 50) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, 16)
        self.attn = Attention(16, causal, mask, eager)
        self.head = nn.Linear(16, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.attn(self.embed(ids)))


class TinyForCausalLM(TokenModel):
    """Named as Hugging Face names a language model: its masked attention reads as causal."""


class Seq2Seq(nn.Module):
    """Encoder and decoder inputs looked up in one shared table (T5, BART)."""

    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Embedding(50, 16)
        self.encoder, self.decoder = Attention(16, causal=False), Attention(16, causal=False)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        return self.encoder(self.shared(src)) + self.decoder(self.shared(tgt))


class TinyVit(nn.Module):
    def __init__(self, patch: int = 4) -> None:
        super().__init__()
        self.patches = nn.Conv2d(3, 16, patch, stride=patch)
        self.attn = Attention(16, causal=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.patches(x).flatten(2).transpose(1, 2)
        return self.attn(tokens).mean(1)


class ConvThenLinear(nn.Module):
    """A stem convolution with few FLOPs and pointwise layers as nn.Linear (ConvNeXt's shape)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 4, stride=4)
        self.mlp = nn.Sequential(nn.Linear(8, 512), nn.GELU(), nn.Linear(512, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.stem(x).permute(0, 2, 3, 1))


IDS = torch.randint(0, 50, (2, 12))
IMAGE = torch.randn(2, 3, 16, 16)


def test_most_flops_in_convolutions_is_a_cnn():
    cnn = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Flatten(), nn.Linear(16 * 8 * 8, 10))
    assert family(cnn, IMAGE) == "cnn"


def test_a_convolution_without_attention_is_a_cnn_even_with_few_of_its_flops():
    assert family(ConvThenLinear(), IMAGE) == "cnn"


def test_a_stack_of_linear_layers_is_an_mlp():
    mlp = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    assert family(mlp, torch.randn(4, 32)) == "mlp"


def test_causal_attention_over_token_embeddings_is_a_decoder():
    assert family(TokenModel(causal=True), IDS) == "decoder"


def test_bidirectional_attention_over_token_embeddings_is_an_encoder():
    assert family(TokenModel(causal=False), IDS) == "encoder"


@pytest.mark.parametrize("how", ["mask", "eager"])
def test_attention_of_unreadable_causality_follows_the_class_name(how):
    kwargs = {how: True}
    assert family(TokenModel(**kwargs), IDS) == "encoder"
    assert family(TinyForCausalLM(**kwargs), IDS) == "decoder"


def test_a_shared_table_looked_up_twice_is_an_encoder_decoder():
    assert family(Seq2Seq(), IDS, IDS) == "encoder-decoder"


def test_patches_and_attention_are_a_vision_transformer():
    assert family(TinyVit(), IMAGE) == "vision-transformer"


def test_attention_without_tokens_or_patches_is_other():
    overlapping = TinyVit()
    overlapping.patches = nn.Conv2d(3, 16, 3, stride=2, padding=1)  # patches overlap: not a patch embedding
    assert family(overlapping, IMAGE) == "other"


def test_a_recurrent_network_is_an_rnn():
    class Lstm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm, self.head = nn.LSTM(8, 16, batch_first=True), nn.Linear(16, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.lstm(x)[0])

    assert family(Lstm(), torch.randn(2, 5, 8)) == "rnn"


def test_the_family_is_the_same_in_training():
    a = analyze(TokenModel(causal=True), inputs=(IDS,), train=True)
    assert trace_family(a.trace, a.ops) == "decoder"
