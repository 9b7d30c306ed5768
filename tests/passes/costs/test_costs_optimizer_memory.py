"""Optimizer kernels, copies and casts: bytes and FLOPs from the shapes by hand."""

from __future__ import annotations

import torch
from torch import nn

from nnperf.passes.costs import lookup
from nnperf.passes.costs.optimizer import foreach_launches
from nnperf.passes.costs.registry import ALLOC, HOST, MEMORY, OPTIMIZER
from nnperf.trace.capture import trace_workload
from nnperf.trace.options import TraceOptions
from nnperf.workload import Workload

IN, OUT, B = 8, 4, 2
PARAMS = IN * OUT + OUT  # Linear(8, 4): weight and bias


def step_events(optimizer, impl, **extra):
    tr, _ = trace_workload(
        lambda: Workload(nn.Linear(IN, OUT), (torch.randn(B, IN),)),
        TraceOptions(train=True, optimizer=optimizer, optimizer_impl=impl, **extra),
    )
    return tr.events


def costs(evs, name):
    return [lookup(e)(e) for e in evs if e.name == name]


def test_foreach_add_over_a_parameter_list():
    evs = step_events("adamw", "foreach")
    device_adds = [c for c in costs(evs, "aten._foreach_add_") if c.category == OPTIMIZER]
    # exp_avg_sq + eps: one list of both tensors, read and written in place
    (eps_add,) = device_adds
    assert sum(t.numel for t in eps_add.reads) == PARAMS
    assert sum(t.numel for t in eps_add.writes) == PARAMS
    assert eps_add.flops == PARAMS
    assert eps_add.info["tensors"] == 2
    assert eps_add.info["launches"] == 1
    (steps,) = [c for c in costs(evs, "aten._foreach_add_") if c.category == HOST]
    assert not steps.reads


def test_foreach_addcdiv_reads_three_lists():
    (c,) = costs(step_events("adamw", "foreach"), "aten._foreach_addcdiv_")
    assert sum(t.numel for t in c.reads) == 3 * PARAMS  # params, exp_avg, denom
    assert sum(t.numel for t in c.writes) == PARAMS
    assert c.flops == 3 * PARAMS


def test_fused_adamw_reads_and_writes_param_grad_and_state():
    (c,) = costs(step_events("adamw", "fused"), "aten._fused_adamw_")
    f32 = 4
    # params, grads, exp_avg, exp_avg_sq read (+ two 0-dim step counters)
    assert sum(t.nbytes for t in c.reads) == 4 * PARAMS * f32 + 2 * f32
    # params, exp_avg, exp_avg_sq written
    assert sum(t.nbytes for t in c.writes) == 3 * PARAMS * f32
    assert c.flops == (13 + 1) * PARAMS  # Adam update + decoupled weight decay
    assert c.info["tensors"] == 2


def test_fused_sgd_with_momentum():
    (c,) = costs(step_events("sgd-momentum", "fused"), "aten._fused_sgd_")
    assert sum(t.numel for t in c.writes) == 2 * PARAMS  # params and momentum buffers
    assert c.flops == (2 + 3) * PARAMS


def test_foreach_launch_packing():
    chunk = 65536
    assert foreach_launches([10] * 110, depth=1) == 1
    assert foreach_launches([10] * 111, depth=1) == 2
    assert foreach_launches([10] * 65, depth=2) == 2  # 64 tensors per launch at depth 2
    assert foreach_launches([320 * chunk], depth=1) == 1
    assert foreach_launches([320 * chunk + 1], depth=1) == 2
    assert foreach_launches([], depth=1) == 0


def test_dtype_cast_bytes_differ_on_the_two_sides():
    class Cast(nn.Module):
        def forward(self, x):
            return x.to(torch.bfloat16)

    tr, _ = trace_workload(
        lambda: Workload(Cast(), (torch.randn(B, IN),)), TraceOptions(train=False)
    )
    (c,) = costs(tr.events, "aten._to_copy")
    assert c.category == MEMORY
    assert sum(t.nbytes for t in c.reads) == B * IN * 4
    assert sum(t.nbytes for t in c.writes) == B * IN * 2
    assert c.info["cast"]


def test_cat_reads_every_part_and_empty_is_allocation_only():
    class Cat(nn.Module):
        def forward(self, x):
            return torch.cat([x, 2 * x, torch.empty(1, IN)])

    tr, _ = trace_workload(
        lambda: Workload(Cat(), (torch.randn(B, IN),)), TraceOptions(train=False)
    )
    (c,) = costs(tr.events, "aten.cat")
    assert sum(t.numel for t in c.reads) == (2 * B + 1) * IN
    assert sum(t.numel for t in c.writes) == (2 * B + 1) * IN
    (alloc,) = costs(tr.events, "aten.empty")
    assert alloc.category == ALLOC and not alloc.reads and not alloc.writes


def test_item_is_a_sync_in_the_forward():
    class Item(nn.Module):
        def forward(self, x):
            return x * x.sum().item()

    tr, _ = trace_workload(
        lambda: Workload(Item(), (torch.randn(B, IN),)), TraceOptions(train=False, real=True)
    )
    (c,) = costs(tr.events, "aten._local_scalar_dense")
    assert c.category == HOST and c.info["sync"]
