"""The GradScaler's kernels counted by hand: the unscale pass reads and writes every gradient,
the scale update is one tiny kernel, and the found-inf ``.item()`` is a host sync while the
optimizers' step-counter reads are not."""

from __future__ import annotations

import torch
from torch import nn

from nnperf.passes.costs import lookup
from nnperf.passes.costs.registry import HOST, OPTIMIZER
from nnperf.trace.capture import trace_workload
from nnperf.trace.grad_scaler import GRAD_SCALER_MODULE
from nnperf.trace.options import TraceOptions
from nnperf.workload import Workload

IN, OUT, B = 8, 4, 2
GRAD_ELEMENTS = IN * OUT + OUT  # Linear(8, 4): weight and bias gradients, fp32 under autocast


def fp16_step(model: nn.Module, impl: str = "foreach"):
    tr, _ = trace_workload(
        lambda: Workload(model, (torch.randn(B, IN),)),
        TraceOptions(train=True, optimizer="adamw", optimizer_impl=impl, amp="fp16"),
    )
    return tr.events


def cost_of(events, name, module=GRAD_SCALER_MODULE):
    (event,) = [e for e in events if e.name == name and e.module == module]
    return lookup(event)(event)


def test_unscale_reads_and_writes_every_gradient():
    c = cost_of(fp16_step(nn.Linear(IN, OUT)), "aten._amp_foreach_non_finite_check_and_unscale_")
    assert c.category == OPTIMIZER
    # read: 36 fp32 gradient elements + the fp32 inv_scale; written back: the 36 elements
    assert sum(t.nbytes for t in c.reads) == GRAD_ELEMENTS * 4 + 4 == 148
    assert sum(t.nbytes for t in c.writes) == GRAD_ELEMENTS * 4 == 144
    assert c.flops == 2 * GRAD_ELEMENTS  # isfinite test + multiply per element
    assert c.info["tensors"] == 2 and c.info["launches"] == 1


def test_unscale_launches_follow_multi_tensor_apply_packing():
    # 120 tiny gradients: multi_tensor_apply<1> takes at most 110 tensors per launch
    model = nn.Sequential(*[nn.Linear(IN, IN) for _ in range(59)], nn.Linear(IN, OUT))
    c = cost_of(fp16_step(model), "aten._amp_foreach_non_finite_check_and_unscale_")
    assert c.info["tensors"] == 120
    assert c.info["launches"] == 2
    elements = 59 * (IN * IN + IN) + GRAD_ELEMENTS
    assert sum(t.numel for t in c.writes) == elements


def test_update_scale_is_one_tiny_device_kernel():
    c = cost_of(fp16_step(nn.Linear(IN, OUT)), "aten._amp_update_scale_")
    assert c.category == OPTIMIZER  # a device kernel, not host bookkeeping
    # reads scale (fp32), growth tracker (int32), found_inf (fp32); writes scale and tracker
    assert sum(t.nbytes for t in c.reads) == 12
    assert sum(t.nbytes for t in c.writes) == 8
    assert c.flops == 1 and c.info["launches"] == 1


def test_found_inf_read_syncs_and_step_counter_reads_do_not():
    events = fp16_step(nn.Linear(IN, OUT), impl="single")
    c = cost_of(events, "aten._local_scalar_dense")
    assert c.category == HOST and c.info["sync"]
    counters = [lookup(e)(e) for e in events if e.name == "aten._local_scalar_dense" and e.module == "(optimizer)"]
    assert counters and not any(k.info["sync"] for k in counters)


def test_scaler_ops_of_a_fused_step_are_device_kernels_without_sync():
    events = fp16_step(nn.Linear(IN, OUT), impl="fused")
    scaler = [e for e in events if e.module == GRAD_SCALER_MODULE]
    assert not [e for e in scaler if e.name == "aten._local_scalar_dense"]
    assert all(lookup(e)(e).category != HOST for e in scaler)
