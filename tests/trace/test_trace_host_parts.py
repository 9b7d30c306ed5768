"""What the trace counts for the host model (``passes.host_time``): module calls and their
hooks, forward ops that record an autograd node, the backward node each backward op runs in,
and which op starts a call made from Python. Each count is checked against the same step run
for real with PyTorch's own hooks, or against the autograd graph walked by hand."""

from __future__ import annotations

import torch
from torch import nn

from nnperf.analysis import analyze


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x)) + x


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _trace(model: nn.Module, train: bool = True):
    return analyze(model, inputs=(torch.randn(4, 8),), train=train, optimizer="sgd").trace


def test_module_calls_are_counted_once_each():
    model = Net()
    calls = []
    handle = nn.modules.module.register_module_forward_pre_hook(lambda m, a: calls.append(m))
    try:
        model(torch.randn(4, 8))
    finally:
        handle.remove()
    trace = _trace(Net(), train=False)
    assert sum(e.module_calls for e in trace.events) == len(calls) == 8  # Net, 2 x (Block, fc, act), head
    assert sum(e.module_hooks for e in trace.events) == 0


def test_a_modules_own_forward_hooks_are_counted():
    model = Net()
    model.head.register_forward_hook(lambda m, a, out: None)
    model.blocks[0].fc.register_forward_pre_hook(lambda m, a: None)
    trace = _trace(model, train=False)
    assert sum(e.module_hooks for e in trace.events) == 2


def test_forward_ops_record_autograd_nodes_in_training_only():
    trained, inferred = _trace(Net()), _trace(Net(), train=False)
    forward = [e for e in trained.events if e.phase == "forward" and not e.free]
    # every forward op reads a weight (or an activation that needs grad): each records a node
    assert forward and all(e.records_grad for e in forward)
    assert not any(e.records_grad for e in inferred.events)


def _graph_nodes(loss: torch.Tensor) -> int:
    """Autograd nodes that run in ``loss.backward()``, by walking the graph by hand."""
    seen, todo = set(), [loss.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        todo.extend(n for n, _ in node.next_functions)
    return len(seen)


def test_backward_ops_name_their_node():
    model = Net()
    loss = model(torch.randn(4, 8)).sum()
    nodes = _graph_nodes(loss)
    trace = analyze(Net(), inputs=(torch.randn(4, 8),), loss_fn=lambda out: out.sum(), optimizer="none").trace
    backward = [e for e in trace.events if e.phase == "backward"]
    numbered = {e.backward_node for e in backward if e.backward_node >= 0}
    # nodes that dispatch no op (a sum's expand is one op; AddBackward passes gradients on)
    # are not seen by the trace: at most the graph's nodes, and every op of one node is
    # numbered alike, in first-run order
    assert 0 < len(numbered) <= nodes and numbered == set(range(len(numbered)))
    assert all(e.backward_node == -1 for e in trace.events if e.phase != "backward")


def test_the_first_op_of_a_python_call_is_marked():
    trace = _trace(Net(), train=False)
    ops = [(e.name, e.python_call) for e in trace.events]
    # nn.Linear -> F.linear (one Python call) -> t (from Python) then addmm (from C++)
    first_linear = ops.index(("aten.t", True))
    assert ops[first_linear + 1] == ("aten.addmm", False)
    assert ("aten.relu", True) in ops and ("aten.add", True) in ops


def test_each_call_of_a_compiled_block_numbers_its_ops():
    """With the blocks compiled (``pointwise="fused"``), the ops a block's forward runs, and those
    of the backward nodes that forward made, carry that call's number (``OpEvent.block_call``),
    in call order; the head's, the loss's and the optimizer's carry none, nor does an eager
    step's, nor the engine's accumulation of a weight's gradient (a view: ``.grad`` is set to
    the gradient detached)."""
    compiled = analyze(Net(), inputs=(torch.randn(4, 8),), train=True, optimizer="sgd", pointwise="fused").trace
    for e in compiled.events:
        inside = e.module.split(".")[:2]
        expected = int(inside[1]) if inside[0] == "blocks" and e.phase in ("forward", "backward") else -1
        allowed = {expected, -1} if e.phase == "backward" and e.name == "aten.detach" else {expected}
        assert e.block_call in allowed, (e.index, e.name, e.module, e.phase, e.block_call)
    calls = [e.block_call for e in compiled.events if e.phase == "forward" and e.block_call >= 0]
    assert calls == sorted(calls) and set(calls) == {0, 1}
    assert {e.block_call for e in compiled.events if e.phase == "backward"} == {-1, 0, 1}
    assert all(e.block_call == -1 for e in _trace(Net()).events)
