"""BERT-large as NVIDIA DeepLearningExamples builds it, with its pre-training or SQuAD heads.

Written from DLE ``PyTorch/LanguageModeling/BERT/modeling.py`` (unchanged from commit a07d20a1,
the last update of the README tables in ``validation/published/dle-bert.toml``, to 729963dd),
``run_pretraining.py`` and ``run_squad.py``. It is not the zoo's ``bert-base`` (Hugging Face
layout, SDPA) with other sizes: DLE runs attention as explicit ``bmm`` products on
(seq, batch, hidden) activations, so the traced kernels differ:

- ``bert_configs/large.json``: 24 layers, hidden 1024, 16 heads, FFN 4096, 512 positions,
  vocabulary 30522, which both scripts pad to a multiple of 8 (30528) before building the model;
- embeddings: word + position + token type, LayerNorm (eps 1e-12), dropout 0.1;
- the encoder transposes to (seq, batch, hidden); self-attention: Q/K/V ``Linear``, scores =
  ``bmm(Q, K^T)`` viewed as (batch, heads, seq, seq), divided by sqrt(head_dim), plus the
  additive mask ``(1 - mask) * -10000``, softmax, dropout 0.1, ``bmm`` with V; then dense,
  dropout, LayerNorm(x + residual); FFN ``gelu(linear)`` with the tanh approximation
  (``LinearActivation``), dense, dropout, LayerNorm(x + residual); transposed back;
- pooler: ``tanh(linear(first token))``, computed by ``BertModel`` for both heads;
- ``bert-large``: ``BertForPreTraining(sequence_output_is_dense=True)`` as run_pretraining.py
  builds it: the masked-LM head (dense + GELU + LayerNorm, decoder tied to the word embeddings,
  bias) runs only on the masked positions (``index_select`` of the flattened sequence output),
  NSP reads the pooler; loss = cross entropy of both. The masked count per sequence is BERT's
  ``create_pretraining_data`` rule for full-length sequences, ``round(0.15 * seq_len)`` (19 at
  128, 77 at 512; run_pretraining.sh caps it at 20 / 80). DLE finds those positions with
  ``torch.nonzero`` (a small kernel and a host sync not traced here); this model takes them as
  an input;
- ``bert-large-squad``: ``BertForQuestionAnswering``: ``Linear(hidden, 2)`` on the sequence
  output, split into start/end logits; loss = (CE(start) + CE(end)) / 2 (run_squad.py). The
  pooler is computed and unused, so it never trains (marked ``requires_grad=False`` here).

Not modeled: TorchScript + NVFuser fusion of the elementwise ops in pre-training, apex AMP O2
(fp16 weights with fp32 masters) for SQuAD; the traced step runs eager PyTorch.

Parameters: ``BertModel`` with the padded vocabulary 335,148,032 (Hugging Face's 335,141,888
for bert-large-uncased plus the 6 padded rows x 1024), pre-training 336,232,258, SQuAD
335,150,082 (DLE's own classes counted at a07d20a1).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nnperf.errors import ModelOptionError
from nnperf.workload import Workload

from ._losses import CrossEntropy, random_classes, random_tokens
from ._options import require_divisible, require_positive, resolve_batch_seq, resolve_options
from ._spec import ModelSpec
from .bert import DROPOUT, EPS, DenseNorm  # BertSelfOutput/BertOutput, as in HF's layout

DEFAULTS: dict[str, Any] = {
    "n_layer": 24,
    "n_embd": 1024,
    "n_head": 16,
    "intermediate": 4096,
    "vocab": 30522,
    "max_positions": 512,
}
OPTIONS = {
    "n_layer": "number of encoder layers",
    "n_embd": "hidden size",
    "n_head": "attention heads",
    "intermediate": "feed-forward hidden size",
    "vocab": "vocabulary size (padded to a multiple of 8, as DLE's scripts do)",
    "max_positions": "learned positions (the longest allowed seq_len)",
}
MASKED_LM_PROB = 0.15  # BERT create_pretraining_data.py --masked_lm_prob


def padded_vocab(vocab: int) -> int:
    """run_pretraining.py / run_squad.py: ``vocab_size += 8 - vocab_size % 8`` when not aligned."""
    return vocab + (-vocab) % 8


def gelu(x: Tensor) -> Tensor:
    """DLE's ``gelu``: ``F.gelu(x, approximate=True)``, the tanh approximation."""
    return F.gelu(x, approximate="tanh")


class Embeddings(nn.Module):
    def __init__(self, vocab: int, dim: int, max_positions: int) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, dim)
        self.position_embeddings = nn.Embedding(max_positions, dim)
        self.token_type_embeddings = nn.Embedding(2, dim)
        self.LayerNorm = nn.LayerNorm(dim, eps=EPS)
        self.dropout = nn.Dropout(DROPOUT)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor) -> Tensor:
        positions = torch.arange(input_ids.size(1), dtype=torch.long, device=input_ids.device)
        positions = positions.unsqueeze(0).expand_as(input_ids)
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        x = x + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(x))


class SelfAttention(nn.Module):
    """DLE's ``BertSelfAttention`` on (seq, batch, hidden): two ``bmm`` and an explicit softmax."""

    def __init__(self, dim: int, n_head: int) -> None:
        super().__init__()
        self.n_head, self.head_dim = n_head, dim // n_head
        self.query = nn.Linear(dim, dim)
        self.key = nn.Linear(dim, dim)
        self.value = nn.Linear(dim, dim)
        self.dropout = nn.Dropout(DROPOUT)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        seq, batch, dim = x.shape
        heads = batch * self.n_head
        q = self.query(x).view(seq, heads, self.head_dim).transpose(0, 1)
        k = self.key(x).view(seq, heads, self.head_dim).permute(1, 2, 0)
        v = self.value(x).view(seq, heads, self.head_dim).transpose(0, 1)
        scores = torch.bmm(q, k).view(batch, self.n_head, seq, seq)
        scores = scores / math.sqrt(self.head_dim) + mask
        probs = self.dropout(F.softmax(scores, dim=-1)).view(heads, seq, seq)
        context = torch.bmm(probs, v).transpose(0, 1).contiguous()
        return context.view(seq, batch, dim)


class Layer(nn.Module):
    def __init__(self, dim: int, n_head: int, hidden: int) -> None:
        super().__init__()
        self.attention = nn.Module()
        self.attention.self = SelfAttention(dim, n_head)
        self.attention.output = DenseNorm(dim, dim)
        self.intermediate = nn.Module()
        self.intermediate.dense_act = nn.Linear(dim, hidden)  # LinearActivation(act="gelu")
        self.output = DenseNorm(hidden, dim)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        x = self.attention.output(self.attention.self(x, mask), x)
        return self.output(gelu(self.intermediate.dense_act(x)), x)


class BertModel(nn.Module):
    """Embeddings, encoder on (seq, batch, hidden), pooler; returns (sequence, pooled)."""

    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        self.embeddings = Embeddings(padded_vocab(c["vocab"]), c["n_embd"], c["max_positions"])
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList(
            Layer(c["n_embd"], c["n_head"], c["intermediate"]) for _ in range(c["n_layer"])
        )
        self.pooler = nn.Module()
        self.pooler.dense_act = nn.Linear(c["n_embd"], c["n_embd"])  # LinearActivation(tanh)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor, attention_mask: Tensor
                ) -> tuple[Tensor, Tensor]:  # fmt: skip
        mask = attention_mask.unsqueeze(1).unsqueeze(2)
        mask = mask.to(dtype=self.embeddings.word_embeddings.weight.dtype)
        mask = (1.0 - mask) * -10000.0
        x = self.embeddings(input_ids, token_type_ids).transpose(0, 1)
        for layer in self.encoder.layer:
            x = layer(x, mask)
        x = x.transpose(0, 1).contiguous()
        return x, torch.tanh(self.pooler.dense_act(x[:, 0]))


class LMPredictionHead(nn.Module):
    """Transform (dense + GELU + LayerNorm), decoder tied to the word embeddings, bias."""

    def __init__(self, dim: int, word_embeddings: nn.Embedding) -> None:
        super().__init__()
        self.transform = nn.Module()
        self.transform.dense_act = nn.Linear(dim, dim)
        self.transform.LayerNorm = nn.LayerNorm(dim, eps=EPS)
        self.decoder = nn.Linear(dim, word_embeddings.num_embeddings, bias=False)
        self.decoder.weight = word_embeddings.weight
        self.bias = nn.Parameter(torch.zeros(word_embeddings.num_embeddings))

    def forward(self, x: Tensor) -> Tensor:
        x = self.transform.LayerNorm(gelu(self.transform.dense_act(x)))
        return self.decoder(x) + self.bias


class BertForPreTraining(nn.Module):
    """Returns (masked-LM logits (masked tokens, vocab), next-sentence logits (batch, 2))."""

    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        self.bert = BertModel(c)
        self.cls = nn.Module()
        self.cls.predictions = LMPredictionHead(c["n_embd"], self.bert.embeddings.word_embeddings)
        self.cls.seq_relationship = nn.Linear(c["n_embd"], 2)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor, attention_mask: Tensor,
                masked_positions: Tensor) -> tuple[Tensor, Tensor]:  # fmt: skip
        x, pooled = self.bert(input_ids, token_type_ids, attention_mask)
        masked = torch.index_select(x.view(-1, x.shape[-1]), 0, masked_positions)
        return self.cls.predictions(masked), self.cls.seq_relationship(pooled)


class BertForQuestionAnswering(nn.Module):
    """Returns (start logits, end logits), each (batch, seq)."""

    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        self.bert = BertModel(c)
        self.qa_outputs = nn.Linear(c["n_embd"], 2)
        # The pooler runs but its output is unused, so in DLE it never gets a gradient and the
        # optimizer never gives it state. Said explicitly here because nnperf's trace creates
        # optimizer state for every trainable parameter before the traced step.
        self.bert.pooler.requires_grad_(False)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor, attention_mask: Tensor
                ) -> tuple[Tensor, Tensor]:  # fmt: skip
        x, _ = self.bert(input_ids, token_type_ids, attention_mask)
        start, end = self.qa_outputs(x).split(1, dim=-1)
        return start.squeeze(-1), end.squeeze(-1)


class PretrainingLoss:
    """run_pretraining.py's ``BertPretrainingCriterion``: masked-LM CE plus NSP CE."""

    def __init__(self, mlm_labels: Tensor, nsp_labels: Tensor) -> None:
        self.mlm, self.nsp = CrossEntropy(mlm_labels), CrossEntropy(nsp_labels)

    def __call__(self, output: Any) -> Tensor:
        mlm_logits, nsp_logits = output
        return self.mlm(mlm_logits) + self.nsp(nsp_logits)

    def __repr__(self) -> str:
        return f"PretrainingLoss(mlm={self.mlm!r}, nsp={self.nsp!r})"


class SquadLoss:
    """run_squad.py: (CE(start logits, start) + CE(end logits, end)) / 2."""

    def __init__(self, starts: Tensor, ends: Tensor) -> None:
        self.start, self.end = CrossEntropy(starts), CrossEntropy(ends)

    def __call__(self, output: Any) -> Tensor:
        start_logits, end_logits = output
        return (self.start(start_logits) + self.end(end_logits)) / 2

    def __repr__(self) -> str:
        return f"SquadLoss(start={self.start!r}, end={self.end!r})"


def masked_per_sequence(seq: int) -> int:
    """BERT's ``num_to_predict`` for a full sequence: ``max(1, round(seq * 0.15))``."""
    return max(1, round(seq * MASKED_LM_PROB))


def _config(name: str, batch: int | None, seq_len: int | None, default_batch: int,
            default_seq: int, overrides: dict[str, Any]) -> tuple[int, int, dict[str, Any]]:  # fmt: skip
    batch, seq = resolve_batch_seq(name, batch, seq_len, default_batch, default_seq)
    c = resolve_options(name, overrides, DEFAULTS)
    require_positive(name, c, *DEFAULTS)
    require_divisible(name, c, "n_embd", "n_head")
    assert seq is not None
    if seq > c["max_positions"]:
        raise ModelOptionError(f"{name}: seq_len {seq} exceeds max_positions {c['max_positions']}")
    return batch, seq, c


def _inputs(batch: int, seq: int, vocab: int) -> tuple[Tensor, Tensor, Tensor]:
    """Token ids, token types (two segments, as BERT inputs have) and an all-ones mask."""
    tokens = random_tokens(batch, seq, vocab)
    types = torch.zeros(batch, seq, dtype=torch.long)
    types[:, seq // 2 :] = 1
    return tokens, types, torch.ones(batch, seq, dtype=torch.long)


def _workload(name: str, model: nn.Module, inputs: tuple[Tensor, ...], loss: Any,
              c: dict[str, Any]) -> Workload:  # fmt: skip
    batch, seq = inputs[0].shape
    info = {"seq_len": int(seq), "vocab": padded_vocab(c["vocab"]), "config": dict(c)}
    return Workload(model, inputs, loss, samples=int(batch), tokens=int(batch * seq), name=name,
                    info=info)  # fmt: skip


def build_pretraining(batch: int | None = None, seq_len: int | None = None,
                      **overrides: Any) -> Workload:  # fmt: skip
    """Token ids, types, mask and the masked positions; loss is masked-LM + NSP."""
    batch, seq, c = _config("bert-large", batch, seq_len, PRETRAINING.default_batch, 128,
                            overrides)  # fmt: skip
    per_seq = masked_per_sequence(seq)
    # The first ``per_seq`` tokens of every sequence, in the flattened (batch * seq) order that
    # ``nonzero`` would return them; which tokens does not change any shape or cost.
    positions = (torch.arange(batch).unsqueeze(1) * seq + torch.arange(per_seq)).flatten()
    vocab = padded_vocab(c["vocab"])
    mlm_labels = torch.randint(0, vocab, (batch * per_seq,), dtype=torch.long)
    loss = PretrainingLoss(mlm_labels, random_classes(batch, 2))
    inputs = (*_inputs(batch, seq, c["vocab"]), positions)
    return _workload("bert-large", BertForPreTraining(c), inputs, loss, c)


def build_squad(batch: int | None = None, seq_len: int | None = None,
                **overrides: Any) -> Workload:  # fmt: skip
    """Token ids, types and mask; loss is the mean of start and end position cross entropy."""
    batch, seq, c = _config("bert-large-squad", batch, seq_len, SQUAD.default_batch, 384,
                            overrides)  # fmt: skip
    loss = SquadLoss(random_classes(batch, seq), random_classes(batch, seq))
    return _workload("bert-large-squad", BertForQuestionAnswering(c),
                     _inputs(batch, seq, c["vocab"]), loss, c)  # fmt: skip


PRETRAINING = ModelSpec(
    name="bert-large",
    summary="BERT-large (NVIDIA DeepLearningExamples layout) + pre-training heads, 128 tokens",
    family="encoder",
    default_batch=32,
    default_seq=128,
    input_desc="128 tokens, vocab 30522 (padded to 30528), masked LM on 15% of tokens",
    options=OPTIONS,
    build=build_pretraining,
)
SQUAD = ModelSpec(
    name="bert-large-squad",
    summary="BERT-large (NVIDIA DeepLearningExamples layout) + SQuAD span head, 384 tokens",
    family="encoder",
    default_batch=32,
    default_seq=384,
    input_desc="384 tokens, vocab 30522 (padded to 30528)",
    options=OPTIONS,
    build=build_squad,
)
SPECS = [PRETRAINING, SQUAD]
