"""One tensor-parallel rank's share of a Megatron-LM GPT layer, for the recomputation check in
``advise_published.py`` (Korthikanti et al. 2022, arXiv:2205.05198, section 6).

Megatron's tensor parallelism (Shoeybi et al. 2019, arXiv:1909.08053, section 3) splits each
layer's first linear of attention (q, k, v) and of the MLP by output columns and the second by
input rows, so rank r of t holds heads/t attention heads and 4h/t MLP columns, and runs the
layer norms, dropouts and residual adds on the whole hidden size (no sequence parallelism).
This module is that rank's work, written out in eager PyTorch as Megatron of 2022 ran it:
attention by hand (scores = q k^T / sqrt(d), causal mask, softmax, dropout, weighted sum; no
flash attention), GeLU MLP, dropout 0.1 on the attention probabilities and both residual
branches. ``layers`` blocks of it sit in a ModuleList, which is what nnperf's checkpointing
wraps (one block = one layer, as Megatron's full recomputation checkpoints each layer).

What the rank also does and this slice leaves out: the all-reduce after each row-parallel
linear (two in forward, two in backward, and under full recomputation two more), and
Megatron's fused kernels (scale+mask+softmax, bias+GeLU, bias+dropout+add), which run here as
separate kernels.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

#: Korthikanti et al. 2022, Table 3, "22B": 64 heads, hidden 6144, 48 layers, tensor-parallel
#: size 8, micro-batch 4; section 6: sequence length 2048, mixed precision, A100 80GB (Selene).
HIDDEN, HEADS, TP, MICRO_BATCH, SEQ = 6144, 64, 8, 4, 2048
DROPOUT = 0.1  # GPT-3-style Megatron defaults: attention and hidden dropout


class LayerShard(nn.Module):
    """One GPT layer as one of ``tp`` tensor-parallel ranks runs it."""

    def __init__(self, hidden: int, heads: int, tp: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads // tp, hidden // heads
        local = hidden // tp
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * local)  # column-parallel
        self.proj = nn.Linear(local, hidden)  # row-parallel (all-reduce after it: not traced)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * local)  # column-parallel
        self.fc2 = nn.Linear(4 * local, hidden)  # row-parallel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (t.view(b, s, self.heads, self.head_dim).transpose(1, 2)
                   for t in self.qkv(self.ln1(x)).chunk(3, dim=-1))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        causal = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        probs = F.dropout(torch.softmax(scores.masked_fill(causal, float("-inf")), dim=-1), DROPOUT)
        context = (probs @ v).transpose(1, 2).reshape(b, s, self.heads * self.head_dim)
        x = x + F.dropout(self.proj(context), DROPOUT)
        return x + F.dropout(self.fc2(F.gelu(self.fc1(self.ln2(x)))), DROPOUT)


class Layers(nn.Module):
    def __init__(self, layers: int, hidden: int, heads: int, tp: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(LayerShard(hidden, heads, tp) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def build(batch: int = MICRO_BATCH, seq_len: int = SEQ, layers: int = 2) -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The rank's slice of ``layers`` layers of the 22B model and its input activations, which
    need a gradient as every layer's input does inside the model (the layers below it)."""
    x = torch.randn(batch, seq_len, HIDDEN, requires_grad=True)
    return Layers(layers, HIDDEN, HEADS, TP), (x,)
