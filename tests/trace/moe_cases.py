"""A mixture-of-experts layer and tokens that its router sends exactly where a fake trace
assumes (``trace.routing.assigned_experts``, uniform), so a real run's splits match the trace's:
shared by the expert-parallel tests."""

from __future__ import annotations

import torch

from nnperf.trace.routing import assigned_experts
from nnperf.zoo.moe import MoE


def steered_moe(dim: int, hidden: int, experts: int, top_k: int, shared_hidden: int = 0) -> MoE:
    """A MoE layer whose gate row e reads input feature e: a token's large features pick its
    experts; ``shared_hidden``: with shared experts (DeepSeek's) of that SwiGLU width."""
    from nnperf.zoo.llama import FeedForward

    torch.manual_seed(0)
    model = MoE(dim, hidden, experts, top_k, FeedForward(dim, shared_hidden) if shared_hidden else None)
    with torch.no_grad():
        model.gate.weight.copy_(torch.eye(experts, dim))
    return model


def assumed_tokens(tokens: int, dim: int, experts: int, top_k: int) -> torch.Tensor:
    """One sequence of ``tokens`` whose top-k experts are the trace's assumed ones, in order."""
    torch.manual_seed(1)
    x = 0.01 * torch.randn(1, tokens, dim)
    for t, chosen in enumerate(assigned_experts(tokens, top_k, [1 / experts] * experts)):
        for slot, e in enumerate(chosen):
            x[0, t, e] = 10.0 - slot
    return x
