"""Elementwise formulas, checked against counts worked out by hand from the shapes."""

from __future__ import annotations

import torch
from torch import nn

from nnperf.passes.costs import lookup
from nnperf.passes.costs.elementwise import ELEMENT_FLOPS
from nnperf.passes.costs.registry import ELEMENTWISE, HOST
from nnperf.trace.capture import trace_workload
from nnperf.trace.options import TraceOptions
from nnperf.workload import Workload

B, T, D = 2, 3, 8


class Lambda(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def events(fn, *inputs, **options):
    opts = TraceOptions(**({"train": False} | options))
    trace, _ = trace_workload(lambda: Workload(Lambda(fn), tuple(inputs)), opts)
    return trace.events


def only(evs, name):
    found = [e for e in evs if e.name == name and not e.free]
    assert len(found) == 1, [e.name for e in evs]
    return found[0]


def cost(event):
    formula = lookup(event)
    assert formula is not None, event.name
    return formula(event)


def elements(metas):
    return sum(t.numel for t in metas)


def test_broadcast_add_reads_the_bias_at_its_own_size():
    c = cost(only(events(torch.add, torch.randn(B, T, D), torch.randn(D)), "aten.add"))
    assert c.category == ELEMENTWISE
    assert elements(c.reads) == B * T * D + D
    assert elements(c.writes) == B * T * D
    assert c.flops == B * T * D


def test_expanded_operand_is_read_once_not_per_broadcast_row():
    c = cost(
        only(
            events(lambda x, y: x * y.expand(B, T, D), torch.randn(B, T, D), torch.randn(1, 1, D)),
            "aten.mul",
        )
    )
    assert elements(c.reads) == B * T * D + D


def test_in_place_op_writes_its_self_argument_once():
    def fn(x, y):
        x = x.clone()
        x.add_(y, alpha=0.5)
        return x

    c = cost(only(events(fn, torch.randn(T, D), torch.randn(T, D)), "aten.add_"))
    assert elements(c.writes) == T * D  # not the aliasing output a second time
    assert elements(c.reads) == 2 * T * D
    assert c.flops == 2 * T * D  # a + alpha * b


def test_transcendental_activation_costs_its_table_entry():
    c = cost(only(events(nn.functional.gelu, torch.randn(B, D)), "aten.gelu"))
    assert c.flops == ELEMENT_FLOPS["gelu"] * B * D
    tanh = cost(
        only(
            events(lambda x: nn.functional.gelu(x, approximate="tanh"), torch.randn(B, D)),
            "aten.gelu",
        )
    )
    assert tanh.flops > c.flops


def test_where_reads_condition_and_both_operands():
    def fn(x, y):
        return torch.where(x > 0, x, y)

    c = cost(only(events(fn, torch.randn(T, D), torch.randn(D)), "aten.where"))
    # condition (bool, T*D), x (T*D), y (D)
    assert sorted(t.numel for t in c.reads) == sorted([T * D, T * D, D])
    assert sum(t.nbytes for t in c.reads) == T * D * 1 + T * D * 4 + D * 4


def test_untagged_backward_ops_are_elementwise():
    x = torch.randn(B, D, requires_grad=True)
    evs = events(nn.functional.hardtanh, x, train=True, optimizer="none")
    c = cost(only(evs, "aten.hardtanh_backward"))
    assert c.category == ELEMENTWISE
    assert elements(c.writes) == B * D
    # the forward input, and grad_output: the default sum loss's gradient is one value
    # expanded (stride 0) to (B, D), so only that one element is read
    assert elements(c.reads) == B * D + 1


def test_step_counters_of_a_single_tensor_optimizer_are_host_ops():
    model = nn.Linear(D, 4)
    trace, _ = trace_workload(
        lambda: Workload(model, (torch.randn(B, D),)),
        TraceOptions(train=True, optimizer="adam", optimizer_impl="single"),
    )
    steps = [e for e in trace.events if e.name == "aten.add_" and not e.inputs[0].shape]
    assert len(steps) == 2  # one per parameter
    for e in steps:
        c = cost(e)
        assert c.category == HOST
        assert not c.reads and not c.writes
