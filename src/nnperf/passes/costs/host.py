"""Ops that run on the host: reading a scalar out (``.item()``) and lifting constants.

``_local_scalar_dense`` copies one element to the host. On a GPU that is a device->host
copy that waits for every queued kernel: a synchronization (``info["sync"]``) the time model
must charge. The exception is the optimizers' ``step`` counters, which non-fused PyTorch
optimizers keep on the host (0-dim tensors read in the optimizer phase): reading them costs
no sync. A GradScaler's ``found_inf`` read (``scaler.step`` with a non-fused optimizer) is
a real sync: the tracer records it before the optimizer phase, in the backward phase, so
this rule (and the timing pass's) charges it (see ``nnperf.trace.grad_scaler``).

``lift_fresh`` wraps a tensor literal (``torch.tensor(1.0)``) built on the host.
"""

from __future__ import annotations

from nnperf.passes.costs.registry import HOST, OpCost, register
from nnperf.trace.events import OpEvent


@register("aten._local_scalar_dense", "aten.item")
def _local_scalar_dense(event: OpEvent) -> OpCost:
    src = event.inputs[0] if event.inputs else None
    host_step = event.phase == "optimizer" and src is not None and len(src.shape) == 0
    return OpCost(HOST, info={"sync": not host_step})


@register("aten.lift_fresh", "aten.lift_fresh_copy", "aten.lift")
def _lift(event: OpEvent) -> OpCost:
    return OpCost(HOST, info={"constant": True})
