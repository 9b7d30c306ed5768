"""BERT-base in Hugging Face's layout, trained with its pre-training heads (MLM + NSP).

The encoder plus pooler is the published 109,482,240-parameter model. Training uses the
``BertForPreTraining`` heads: the masked-LM decoder is tied to the word embeddings (only its
transform and bias are new) and next-sentence prediction reads the pooler, so every
parameter receives a gradient, as in real pre-training.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nnperf.errors import ModelOptionError
from nnperf.trace.parallel.tensor import TensorParallelPlan, gather_input, styles
from nnperf.workload import Workload

from ._attention import attention, merge_heads, split_heads
from ._losses import PretrainingLoss, random_classes, random_tokens
from ._options import require_divisible, require_positive, resolve_batch_seq, resolve_options
from ._spec import ModelSpec
from ._workloads import token_workload

DEFAULTS: dict[str, Any] = {
    "n_layer": 12,
    "n_embd": 768,
    "n_head": 12,
    "intermediate": 3072,
    "vocab": 30522,
    "max_positions": 512,
}
OPTIONS = {
    "n_layer": "number of encoder layers",
    "n_embd": "hidden size",
    "n_head": "attention heads",
    "intermediate": "feed-forward hidden size",
    "vocab": "vocabulary size",
    "max_positions": "learned positions (the longest allowed seq_len)",
}
EPS = 1e-12
DROPOUT = 0.1


class Embeddings(nn.Module):
    """Word + position + token-type embeddings, LayerNorm, dropout."""

    def __init__(self, vocab: int, dim: int, max_positions: int, type_vocab: int = 2) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, dim, padding_idx=0)
        self.position_embeddings = nn.Embedding(max_positions, dim)
        self.token_type_embeddings = nn.Embedding(type_vocab, dim)
        self.LayerNorm = nn.LayerNorm(dim, eps=EPS)
        self.dropout = nn.Dropout(DROPOUT)

    def forward(self, input_ids: Tensor) -> Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        token_types = torch.zeros_like(input_ids)  # single-segment input, as HF defaults to
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        x = x + self.token_type_embeddings(token_types)
        return self.dropout(self.LayerNorm(x))


class SelfAttention(nn.Module):
    """Separate query/key/value projections (HF naming), bidirectional SDPA, no mask."""

    def __init__(self, dim: int, n_head: int) -> None:
        super().__init__()
        self.head_dim = dim // n_head
        self.query = nn.Linear(dim, dim)
        self.key = nn.Linear(dim, dim)
        self.value = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = (split_heads(p(x), self.head_dim) for p in (self.query, self.key, self.value))
        p = DROPOUT if self.training else 0.0
        return merge_heads(attention(q, k, v, causal=False, dropout_p=p))


class DenseNorm(nn.Module):
    """Projection, dropout, residual add, post-LayerNorm (HF's ``*Output`` modules)."""

    def __init__(self, n_in: int, dim: int) -> None:
        super().__init__()
        self.dense = nn.Linear(n_in, dim)
        self.LayerNorm = nn.LayerNorm(dim, eps=EPS)
        self.dropout = nn.Dropout(DROPOUT)

    def forward(self, x: Tensor, residual: Tensor) -> Tensor:
        return self.LayerNorm(self.dropout(self.dense(x)) + residual)


class Attention(nn.Module):
    def __init__(self, dim: int, n_head: int) -> None:
        super().__init__()
        self.self = SelfAttention(dim, n_head)
        self.output = DenseNorm(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.output(self.self(x), x)


class Intermediate(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.dense = nn.Linear(dim, hidden)

    def forward(self, x: Tensor) -> Tensor:
        return F.gelu(self.dense(x))


class Layer(nn.Module):
    """One post-norm encoder layer: attention, then the GELU feed-forward."""

    def __init__(self, dim: int, n_head: int, hidden: int) -> None:
        super().__init__()
        self.attention = Attention(dim, n_head)
        self.intermediate = Intermediate(dim, hidden)
        self.output = DenseNorm(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        x = self.attention(x)
        return self.output(self.intermediate(x), x)


class Encoder(nn.Module):
    def __init__(self, n_layer: int, dim: int, n_head: int, hidden: int) -> None:
        super().__init__()
        self.layer = nn.ModuleList(Layer(dim, n_head, hidden) for _ in range(n_layer))

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.layer:
            x = layer(x)
        return x


class Pooler(nn.Module):
    """tanh(dense(first token)): the sentence vector used by next-sentence prediction."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dense = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        return torch.tanh(self.dense(x[:, 0]))


class BertModel(nn.Module):
    """The 109.5M-parameter base model: embeddings, encoder, pooler."""

    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        self.embeddings = Embeddings(c["vocab"], c["n_embd"], c["max_positions"])
        self.encoder = Encoder(c["n_layer"], c["n_embd"], c["n_head"], c["intermediate"])
        self.pooler = Pooler(c["n_embd"])

    def forward(self, input_ids: Tensor) -> tuple[Tensor, Tensor]:
        x = self.encoder(self.embeddings(input_ids))
        return x, self.pooler(x)


class PredictionHead(nn.Module):
    """MLM head: dense + GELU + LayerNorm transform, decoder tied to the word embeddings."""

    def __init__(self, dim: int, word_embeddings: nn.Embedding) -> None:
        super().__init__()
        self.transform = nn.Module()
        self.transform.dense = nn.Linear(dim, dim)
        self.transform.LayerNorm = nn.LayerNorm(dim, eps=EPS)
        self.decoder = nn.Linear(dim, word_embeddings.num_embeddings, bias=False)
        self.decoder.weight = word_embeddings.weight
        self.bias = nn.Parameter(torch.zeros(word_embeddings.num_embeddings))

    def forward(self, x: Tensor) -> Tensor:
        x = self.transform.LayerNorm(F.gelu(self.transform.dense(x)))
        return self.decoder(x) + self.bias


class PreTrainingHeads(nn.Module):
    def __init__(self, dim: int, word_embeddings: nn.Embedding) -> None:
        super().__init__()
        self.predictions = PredictionHead(dim, word_embeddings)
        self.seq_relationship = nn.Linear(dim, 2)

    def forward(self, x: Tensor, pooled: Tensor) -> tuple[Tensor, Tensor]:
        return self.predictions(x), self.seq_relationship(pooled)


class BertForPreTraining(nn.Module):
    """Returns (MLM logits (B, T, vocab), next-sentence logits (B, 2))."""

    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        self.bert = BertModel(c)
        self.cls = PreTrainingHeads(c["n_embd"], self.bert.embeddings.word_embeddings)

    def tensor_parallel_plan(self) -> TensorParallelPlan:
        """Megatron's split, written for BERT's module names (``_tensor_parallel``); the MLM head
        adds its own bias after the decoder, so the logits are gathered (no loss parallelism)."""
        return TensorParallelPlan("bert", _tensor_parallel, lambda c: {
            "n_head": c["n_head"], "intermediate": c["intermediate"]}, loss_parallel=False)

    def forward(self, input_ids: Tensor) -> tuple[Tensor, Tensor]:
        x, pooled = self.bert(input_ids)
        return self.cls(x, pooled)


def _tensor_parallel(model: nn.Module, mesh: Any, sp: bool, loss_parallel: bool) -> None:
    """Logits gathered (the MLM head adds its own bias after the decoder; no loss parallelism)."""
    from torch.distributed.tensor.parallel import parallelize_module

    Replicate, Shard, Colwise, Rowwise, SequenceParallel, _, PrepareModuleOutput = styles()
    seq = Shard(1) if sp else Replicate()
    for layer in model.bert.encoder.layer:
        plan: dict[str, Any] = {
            "attention.self.query": Colwise(), "attention.self.key": Colwise(),
            "attention.self.value": Colwise(), "attention.output.dense": Rowwise(output_layouts=seq),
            "intermediate.dense": Colwise(), "output.dense": Rowwise(output_layouts=seq),
        }
        if sp:  # post-norm: the norms' outputs are the residuals, kept as local shards
            plan.update({"attention.output.LayerNorm": SequenceParallel(use_local_output=True),
                         "output.LayerNorm": SequenceParallel(use_local_output=True),
                         "attention.self": gather_input(), "intermediate": gather_input()})
        parallelize_module(layer, mesh, plan)
    top: dict[str, Any] = {
        "bert.embeddings.word_embeddings": Rowwise(input_layouts=Replicate(), output_layouts=Replicate()),
        # a DTensor, so the head's own (replicated) bias adds to it
        "cls.predictions.decoder": Colwise(output_layouts=Replicate(), use_local_output=False),
    }
    if sp:
        top["bert.embeddings"] = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(1),
                                                     use_local_output=True)
        top["bert.pooler"] = gather_input(local=True)
        top["cls"] = gather_input(2, local=True)
    parallelize_module(model, mesh, top)
    model.cls.predictions.decoder.weight = model.bert.embeddings.word_embeddings.weight


def build(batch: int | None = None, seq_len: int | None = None, **overrides: Any) -> Workload:
    """Token ids (batch, seq); loss is MLM cross entropy at every position plus NSP."""
    batch, seq = resolve_batch_seq("bert-base", batch, seq_len, SPEC.default_batch, 128)
    c = resolve_options("bert-base", overrides, DEFAULTS)
    require_positive("bert-base", c, *DEFAULTS)
    require_divisible("bert-base", c, "n_embd", "n_head")
    assert seq is not None
    if seq > c["max_positions"]:
        raise ModelOptionError(f"bert-base: seq_len {seq} exceeds max_positions {c['max_positions']}")
    model = BertForPreTraining(c)
    tokens = random_tokens(batch, seq, c["vocab"])
    loss = PretrainingLoss(random_tokens(batch, seq, c["vocab"]), random_classes(batch, 2))
    return token_workload("bert-base", model, tokens, loss, c)


SPEC = ModelSpec(
    name="bert-base",
    summary="BERT-base uncased encoder + pre-training heads (MLM tied, NSP), 128 tokens",
    family="encoder",
    default_batch=32,
    default_seq=128,
    input_desc="128 tokens, vocab 30522",
    options=OPTIONS,
    build=build,
)
