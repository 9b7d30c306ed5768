"""A parameter the loss never reaches (an unused head) gets no gradient and so no optimizer
state in a real PyTorch step; the trace must not give it either. The reference is a real
training loop on CPU tensors, its gradients and state counted after two steps (the second
is the steady state a trace records), with both ``zero_grad`` settings."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nnperf.trace.capture import trace_workload
from nnperf.trace.events import KIND_GRAD, KIND_OPT_STATE
from nnperf.trace.options import TraceOptions
from nnperf.trace.step import make_optimizer
from nnperf.workload import Workload


class WithUnusedHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.used = nn.Linear(8, 4)
        self.unused = nn.Linear(100, 100)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


def real_bytes(optimizer: str, persist: bool) -> tuple[int, int]:
    model = WithUnusedHead()
    opt = make_optimizer(model, TraceOptions(train=True, optimizer=optimizer))
    for _ in range(2):
        model(torch.randn(2, 8)).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=not persist)
    grads = sum(p.grad.nbytes for p in model.parameters() if p.grad is not None)
    state = sum(v.nbytes for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor))
    return grads, state


@pytest.mark.parametrize("persist", [False, True])
@pytest.mark.parametrize("optimizer", ["adamw", "sgd-momentum"])
def test_unreached_parameters_have_no_gradient_or_state(optimizer, persist):
    trace, _ = trace_workload(lambda: Workload(WithUnusedHead(), (torch.randn(2, 8),)),
                              TraceOptions(train=True, optimizer=optimizer, grads_persist=persist))
    state = sum(s.nbytes for s in trace.storages.values() if s.kind == KIND_OPT_STATE)
    grads = sum(s.nbytes for s in trace.storages.values() if s.kind == KIND_GRAD)
    real_grads, real_state = real_bytes(optimizer, persist)
    assert state == real_state
    # the trace ends after the optimizer, before zero_grad: the reached gradients are alive
    assert grads == (real_grads if persist else 36 * 4)
    assert state < 100 * 100 * 4  # nothing of the unused head's size
