"""Models whose shapes or control flow depend on tensor values: a clear TraceError naming the
op and the module with the --real way forward, and ``real=True`` then traces them."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nnperf.analysis import analyze
from nnperf.errors import TraceError


class Nonzero(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        return y.sum() + torch.nonzero(y).float().sum()


class Branch(Nonzero):
    def forward(self, x):
        y = self.fc(x)
        return y * 2 if y.sum() > 0 else y


class BoolMask(Nonzero):
    def forward(self, x):
        y = self.fc(x)
        return y[y > 0]


class Router(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.experts = inner

    def forward(self, x):
        return self.experts(x)


@pytest.mark.parametrize(
    "inner, op",
    [(Nonzero, "nonzero"), (Branch, "_local_scalar_dense"), (BoolMask, "index")],
)
def test_data_dependent_model_raises_trace_error_then_real_works(inner, op):
    model = Router(inner())
    x = torch.randn(3, 4)
    with pytest.raises(TraceError) as info:
        analyze(model, inputs=(x,))
    message = str(info.value)
    assert f"aten::{op}" in message
    assert "'experts'" in message  # the module that issued it
    assert "--real" in message
    assert info.value.exit_code == 4
    a = analyze(model, inputs=(x,), real=True)
    assert {e.phase for e in a.trace.events} == {"forward", "backward", "optimizer"}
    assert a.totals["flops"] >= 2 * 3 * 4 * 4 * 3  # the Linear's three GEMMs at least


def test_real_and_fake_traces_count_the_same():
    kw = dict(batch=2, seq_len=16, n_layer=2, n_embd=32, n_head=4, vocab=97, optimizer="sgd")
    fake, real = analyze("gpt2", **kw), analyze("gpt2", real=True, **kw)
    assert real.totals["flops"] == fake.totals["flops"] > 0
    assert [(g.m, g.n, g.k, g.role) for g in real.gemms] == [
        (g.m, g.n, g.k, g.role) for g in fake.gemms
    ]
    assert real.totals["bytes"] == fake.totals["bytes"]


def test_real_mode_leaves_the_users_model_unchanged():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    model.eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    analyze(model, inputs=(torch.randn(3, 4),), real=True)  # trains one AdamW step
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None for p in model.parameters())
    assert not model.training
