"""Mixture of experts on fake tensors (``trace.routing``): the router's choice is an explicit
assumption (uniform, ``moe_load`` shares or a capacity factor), data-dependent expert loops
trace, and every expert GEMM is counted per expert (hand counts below).

Hand count for a block of hidden size D, expert FFN F (gate and up fused: 2F), E experts,
top-k routing and T tokens: T*k routed rows; forward 2*rows*2F*D (gate/up) + 2*rows*D*F
(down); backward: the down projection's input and weight gradients (2 x its forward), the
gate/up projection's weight gradient (1 x its forward) and its input gradient only when the
block's input needs one.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nnperf.analysis import analyze
from nnperf.errors import UsageError
from nnperf.trace.routing import assigned_experts

D, FF, E, K = 64, 128, 8, 2


class GroupedMoE(nn.Module):
    """transformers 5's grouped_mm experts: sort by expert, histc, _grouped_mm."""

    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(D, E, bias=False)
        self.gate_up_proj = nn.Parameter(torch.randn(E, 2 * FF, D))
        self.down_proj = nn.Parameter(torch.randn(E, D, FF))

    def forward(self, x):
        h = x.reshape(-1, D)
        probs = F.softmax(self.gate(h), dim=-1, dtype=torch.float)
        w, idx = torch.topk(probs, K, dim=-1)
        ids_g, perm = torch.sort(idx.reshape(-1))
        xs = h[perm // K]
        counts = torch.histc(ids_g.float(), bins=E, min=0, max=E - 1)
        offs = torch.cumsum(counts, dim=0, dtype=torch.int32)
        g, u = torch._grouped_mm(xs, self.gate_up_proj.transpose(-2, -1), offs=offs).chunk(2, dim=-1)
        y = torch._grouped_mm(F.silu(g) * u, self.down_proj.transpose(-2, -1), offs=offs)
        y = y * w.reshape(-1)[perm].unsqueeze(-1).to(y.dtype)
        return torch.zeros_like(h).index_add_(0, perm // K, y).reshape(x.shape)


class LoopMoE(nn.Module):
    """transformers 4's Mixtral: a loop over the experts hit, nonzero / where(mask)."""

    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(D, E, bias=False)
        self.w1 = nn.ModuleList(nn.Linear(D, FF, bias=False) for _ in range(E))
        self.w3 = nn.ModuleList(nn.Linear(D, FF, bias=False) for _ in range(E))
        self.w2 = nn.ModuleList(nn.Linear(FF, D, bias=False) for _ in range(E))

    def forward(self, x):
        h = x.view(-1, D)
        w, sel = torch.topk(F.softmax(self.gate(h), dim=1, dtype=torch.float), K, dim=-1)
        w = (w / w.sum(dim=-1, keepdim=True)).to(h.dtype)
        out = torch.zeros_like(h)
        mask = F.one_hot(sel, num_classes=E).permute(2, 1, 0)
        for e in torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero():
            idx, top_x = torch.where(mask[e].squeeze(0))
            cur = h[top_x]
            y = self.w2[e](F.silu(self.w1[e](cur)) * self.w3[e](cur)) * w[top_x, idx, None]
            out.index_add_(0, top_x, y)
        return out.reshape(x.shape)


def expert_flops(tokens, input_grad):
    rows = tokens * K
    up, down = 2 * rows * 2 * FF * D, 2 * rows * D * FF
    return up + down + 2 * down + up + (up if input_grad else 0)


def _grouped(a):
    return [g for g in a.gemms if g.op == "aten._grouped_mm"]


def test_grouped_experts_trace_with_uniform_routing_and_per_expert_gemms():
    a = analyze(GroupedMoE(), inputs=(torch.randn(2, 16, D),), dtype="bf16")
    assert a.coverage["uncovered"] == []
    assert len(a.config["assumptions"]) == 1 and "uniformly" in a.config["assumptions"][0]
    gemms = _grouped(a)
    assert sum(g.flops for g in gemms) == expert_flops(32, input_grad=False)
    forward_up = [g for g in gemms if g.phase == "forward" and g.n == 2 * FF]
    assert [(g.m, g.k) for g in forward_up] == [(32 * K // E, D)] * E  # 8 rows per expert
    roles = {g.role for g in gemms if g.phase == "backward"}
    assert roles == {"grad_input", "grad_weight"}
    # the weight gradient splits the reduction over each expert's 8 rows: FF x D (down) and
    # D x 2FF (gate/up), in whichever orientation autograd takes for the transposed weights
    grad_w = {(frozenset((g.m, g.n)), g.k) for g in gemms if g.role == "grad_weight"}
    assert grad_w == {(frozenset((FF, D)), 8), (frozenset((D, 2 * FF)), 8)}


@pytest.mark.parametrize("kw, rows", [
    # 64 tokens x top-2 = 128 routed rows
    ({"moe_load": (4, 2, 1, 1, 0, 0, 0, 0)}, [64, 32, 16, 16]),
    # the busiest at 2 x the mean of 16; 96 rows over the other 7: 13.7 each, so five get 14
    ({"moe_capacity_factor": 2.0}, [32] + [14] * 5 + [13] * 2),
])
def test_user_given_load(kw, rows):
    a = analyze(GroupedMoE(), inputs=(torch.randn(2, 32, D),), dtype="bf16", **kw)
    forward_up = [g for g in _grouped(a) if g.phase == "forward" and g.n == 2 * FF]
    assert [g.m for g in forward_up] == rows
    assert sum(g.flops for g in _grouped(a)) == expert_flops(64, input_grad=False)
    assert "--moe-" in a.config["assumptions"][0]


def test_expert_loop_traces_on_fake_tensors_with_the_same_expert_work():
    """The data-dependent loop (nonzero, where(mask)) used to need --real; with the routing
    assumed, each expert's three linears get T*k/E rows."""
    a = analyze(LoopMoE(), inputs=(torch.randn(2, 16, D),))
    assert a.coverage["uncovered"] == []
    experts = [g for g in a.gemms if g.module.startswith(("w1.", "w2.", "w3."))]
    assert sum(g.flops for g in experts) == expert_flops(32, input_grad=False)  # x needs none
    assert {g.m for g in experts if g.phase == "forward"} == {32 * K // E}
    real = analyze(LoopMoE(), inputs=(torch.randn(2, 16, D),), real=True)
    real_experts = [g for g in real.gemms if g.module.startswith(("w1.", "w2.", "w3."))]
    assert sum(g.flops for g in real_experts) == sum(g.flops for g in experts)  # any routing: T*k rows


def test_assigned_experts_are_distinct_per_token_and_follow_the_shares():
    table = assigned_experts(10, 3, [0.5, 0.2, 0.2, 0.1])
    assert all(len(set(row)) == 3 for row in table)
    counts = [sum(row.count(e) for row in table) for e in range(4)]
    assert counts == [10, 8, 8, 4]  # 15 capped at one per token (10); the rest by remainders


@pytest.mark.parametrize("kw, message", [
    ({"moe_load": (1, 1, 1)}, "3 shares but the router chooses among 8 experts"),
    ({"moe_load": (1, -1) * 4}, "shares must be numbers >= 0"),
    ({"moe_capacity_factor": 0.5}, "must be at least 1"),
    ({"moe_load": (1,) * 8, "moe_capacity_factor": 2.0}, "not both"),
])
def test_bad_routing_options_are_one_line_usage_errors(kw, message):
    with pytest.raises(UsageError, match=message):
        analyze(GroupedMoE(), inputs=(torch.randn(2, 16, D),), dtype="bf16", **kw)


def test_tiny_mixtral_from_transformers():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.MixtralConfig(
        hidden_size=D, intermediate_size=FF, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=E, num_experts_per_tok=K, vocab_size=100,
        max_position_embeddings=64)
    for implementation in ("eager", "grouped_mm"):
        cfg._experts_implementation = implementation
        model = transformers.MixtralForCausalLM(cfg)
        a = analyze(model, inputs=(torch.randint(0, 100, (2, 16)),), dtype="bf16",
                    loss_fn=lambda out: out.logits.float().mean())
        assert a.coverage["uncovered"] == [], implementation
        experts = [g for g in a.gemms if ".experts" in g.module]
        # two layers; the experts' input (after attention and a norm) needs a gradient
        assert sum(g.flops for g in experts) == 2 * expert_flops(32, input_grad=True), implementation
