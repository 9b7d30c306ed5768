"""Autograd's gradient sums: a real step adds in place when it may, a fake one never does; the
trace must show what the real step does. The reference is the PyTorch profiler on a real CPU
step (``aten::add`` vs ``aten::add_`` issued by the engine), not nnperf's own rule."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile

from nnperf.analysis import analyze
from nnperf.trace.events import KIND_GRAD


class TiedLM(nn.Module):
    """An embedding whose weight is also the output projection (GPT-2's tie)."""

    def __init__(self, vocab: int = 64, dim: int = 16):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.ln = nn.LayerNorm(dim)

    def forward(self, tokens):
        return F.linear(self.ln(self.wte(tokens)), self.wte.weight)


class Residual(nn.Module):
    """x + f(x): the gradient of x is the sum of two branches'."""

    def __init__(self, dim: int = 16, branch_first: bool = False):
        super().__init__()
        self.inp = nn.Linear(dim, dim)
        self.ln = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, dim)
        self.branch_first = branch_first

    def forward(self, x):
        h = self.inp(x)
        # which operand comes first decides which gradient reaches h's buffer first
        return self.fc(self.ln(h)) + h if self.branch_first else h + self.fc(self.ln(h))


def _sum_loss(out):
    return out.float().sum()


CASES = {
    "tied-fp32": (TiedLM, lambda: (torch.randint(0, 64, (2, 5)),), None),
    "tied-autocast-bf16": (TiedLM, lambda: (torch.randint(0, 64, (2, 5)),), "bf16"),
    "residual-fp32": (Residual, lambda: (torch.randn(3, 16),), None),
    "residual-branch-first-fp32": (lambda: Residual(branch_first=True), lambda: (torch.randn(3, 16),), None),
}


def _real_backward_adds(model: nn.Module, inputs, amp: str | None) -> Counter:
    """``aten::add`` / ``aten::add_`` the engine runs in a real backward pass (profiler)."""
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if amp else torch.autocast("cpu", enabled=False)
    with ctx:
        loss = _sum_loss(model(*inputs))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        loss.backward()
    return Counter(e.name for e in prof.events() if e.name in ("aten::add", "aten::add_"))


def _traced_backward_adds(model: nn.Module, inputs, amp: str | None) -> Counter:
    a = analyze(model, inputs=inputs, amp=amp, optimizer="none", loss_fn=_sum_loss)
    names = Counter(e.name for e in a.trace.events if e.phase == "backward")
    return Counter({"aten::add": names["aten.add"], "aten::add_": names["aten.add_"]})


@pytest.mark.parametrize("case", sorted(CASES))
def test_engine_sums_are_in_place_exactly_where_a_real_step_does_them_in_place(case):
    cls, make_inputs, amp = CASES[case]
    torch.manual_seed(0)
    model, inputs = cls(), make_inputs()
    real = _real_backward_adds(model, inputs, amp)
    assert sum(real.values()) >= 1, "the case must make the engine sum gradients"
    assert _traced_backward_adds(cls(), make_inputs(), amp) == real


def test_in_place_sum_allocates_nothing_and_keeps_the_first_gradient_alive():
    # Autocast: the output projection's gradient arrives as a fresh fp32 copy (not a view),
    # so the embedding's gradient is added into it; the result is that storage.
    a = analyze(TiedLM(), inputs=(torch.randint(0, 64, (2, 5)),), amp="bf16", optimizer="none",
                loss_fn=_sum_loss)
    sums = [e for e in a.trace.events if e.name == "aten.add_" and e.phase == "backward"]
    assert len(sums) == 1
    e = sums[0]
    assert e.allocates == []
    assert e.outputs[0].storage == e.inputs[0].storage
    assert e.inputs[0].storage not in e.releases
    weight_bytes = 64 * 16 * 4
    assert a.trace.storages[e.inputs[0].storage].nbytes == weight_bytes
    # it becomes the weight's gradient: alive to the end of the step, and labeled a gradient
    assert a.trace.storages[e.inputs[0].storage].released_after is None
    assert a.trace.storages[e.inputs[0].storage].kind == KIND_GRAD
