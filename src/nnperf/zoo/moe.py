"""A token-choice mixture-of-experts feed-forward, written as torchtitan writes it.

torchtitan's ``MoE`` (torchtitan/models/moe: ``TokenChoiceTopKRouter``, ``TokenReorderer``,
``GroupedExperts``) is the layout its expert parallelism (``ExpertParallel``) shards, so the
zoo's MoE models trace the kernels that engine runs:

- a router ``gate`` (a linear to one score per expert), softmax in fp32, ``topk`` of ``k``
  experts per token, the chosen scores renormalized to sum to one (Mixtral's router; DeepSeek's
  16B keeps them as they are, ``renormalize=False``);
- with ``expert_bias``, torchtitan's auxiliary-loss-free balancing: experts are chosen on the
  scores plus a per-expert bias buffer, their scores gathered without it, and the tokens each
  expert got added to a ``tokens_per_expert`` buffer (the optimizer's pre-step hook that
  updates the bias is not modelled: one blocking all-reduce of layers x experts fp32 counts
  over the data-parallel ranks and a few element-wise ops on them, per step);
- tokens counted per expert (``histc``) and sorted by expert (a stable ``argsort``), gathered
  into one buffer of ``tokens x k`` rows and scaled by their scores before the experts
  (torchtitan's ``score_before_experts``) or their outputs after them;
- every expert's SwiGLU in three grouped GEMMs (``torch._grouped_mm`` with the running count
  of rows per expert as offsets) over weights stacked on a leading expert dimension
  (``w1``, ``w3``: experts x hidden x dim; ``w2``: experts x dim x hidden);
- the outputs summed back to their tokens (``scatter_add``), plus an optional shared expert.

The grouped GEMMs run in bf16 whatever the model's dtype, as torchtitan's
``_run_experts_grouped_mm`` casts them: ``_grouped_mm`` is on no autocast list, and PyTorch's
meta kernel for it (what a trace runs) takes bf16 operands only. Which experts a
token picks is a value a fake trace lacks: ``trace.routing`` states the assumed spread.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def _local(weight: Tensor) -> Tensor:
    """An expert-parallel rank's own experts (a DTensor sharded over experts) or all of them."""
    to_local = getattr(weight, "to_local", None)
    return to_local() if to_local is not None else weight


class GroupedExperts(nn.Module):
    """``experts`` SwiGLU feed-forwards as three grouped GEMMs. Its input is the routed rows
    sorted by expert and their count per expert; expert parallelism wraps this module."""

    def __init__(self, dim: int, hidden: int, experts: int) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(experts, hidden, dim))
        self.w2 = nn.Parameter(torch.empty(experts, dim, hidden))
        self.w3 = nn.Parameter(torch.empty(experts, hidden, dim))
        for w in (self.w1, self.w2, self.w3):
            nn.init.normal_(w, std=0.02)

    def forward(self, x: Tensor, tokens_per_expert: Tensor) -> Tensor:
        w1, w2, w3 = (_local(w).to(torch.bfloat16) for w in (self.w1, self.w2, self.w3))
        offsets = torch.cumsum(tokens_per_expert, dim=0, dtype=torch.int32)
        h = x.to(torch.bfloat16)
        gated = F.silu(torch._grouped_mm(h, w1.transpose(-2, -1), offs=offsets))
        gated = gated * torch._grouped_mm(h, w3.transpose(-2, -1), offs=offsets)
        return torch._grouped_mm(gated, w2.transpose(-2, -1), offs=offsets).type_as(x)


class MoE(nn.Module):
    """Router, experts and the optional shared expert of one block (module docstring)."""

    def __init__(self, dim: int, hidden: int, experts: int, top_k: int, shared: nn.Module | None = None, *,
                 renormalize: bool = True, score_before_experts: bool = True, expert_bias: bool = False) -> None:
        super().__init__()
        self.experts_count, self.top_k = experts, top_k
        self.renormalize, self.score_before_experts = renormalize, score_before_experts
        self.gate = nn.Linear(dim, experts, bias=False)
        self.experts = GroupedExperts(dim, hidden, experts)
        self.shared_expert = shared
        if expert_bias:
            self.register_buffer("expert_bias", torch.zeros(experts, dtype=torch.float32))
            self.register_buffer("tokens_per_expert", torch.zeros(experts, dtype=torch.float32), persistent=False)
        else:
            self.expert_bias = None

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        scores = F.softmax(self.gate(x).float(), dim=-1)
        if self.expert_bias is not None:
            _, chosen = torch.topk(scores + self.expert_bias, self.top_k, dim=-1)
            top_scores = scores.gather(1, chosen)
        else:
            top_scores, chosen = torch.topk(scores, self.top_k, dim=-1)
        if self.renormalize:
            top_scores = top_scores / top_scores.sum(dim=-1, keepdim=True)
        tokens_per_expert = torch.histc(chosen.reshape(-1).float(), bins=self.experts_count, min=0,
                                        max=self.experts_count)
        if self.expert_bias is not None:
            with torch.no_grad():
                self.tokens_per_expert.add_(tokens_per_expert)
        tokens_per_expert = tokens_per_expert.to(torch.int64)
        order = torch.argsort(chosen.reshape(-1), stable=True)
        token_of_row = order // self.top_k
        routed = x[token_of_row]
        row_scores = top_scores.reshape(-1)[order].reshape(-1, 1)
        if self.score_before_experts:
            routed = (routed.float() * row_scores).to(x.dtype)
        out_rows = self.experts(routed, tokens_per_expert)
        if not self.score_before_experts:
            out_rows = (out_rows.float() * row_scores).to(x.dtype)
        out = self.shared_expert(x) if self.shared_expert is not None else torch.zeros_like(x)
        out = out.scatter_add(0, token_of_row.reshape(-1, 1).expand(-1, shape[-1]), out_rows.to(out.dtype))
        return out.reshape(shape)
