"""The GradScaler's kernels in fp16 mixed-precision training (``torch.amp.GradScaler``).

``_amp_foreach_non_finite_check_and_unscale_`` multiplies every gradient in place by
``inv_scale`` and flags inf/NaN in ``found_inf``: one ``multi_tensor_apply<1>`` pass over
the gradient list (ATen ``AmpKernels.cu``), so it reads and writes every gradient — the
kernel writes the value back even when ``inv_scale`` is 1, as it is on a fused optimizer's
check-only call. Per element: a finiteness test and a multiply (2 FLOPs). ``found_inf`` is
written only when a non-finite value turns up; the traced step assumes finite gradients
(the steady state), so it costs no traffic.

``_amp_update_scale_`` is a one-thread kernel: it reads the scale, the growth tracker and
``found_inf`` and writes the scale and the tracker. Its time is its launch.

Both are device kernels although their scalar arguments are 0-dim tensors: the scaler keeps
its state on the GPU precisely to avoid host round trips (the one it does make, ``.item()``
of ``found_inf`` in ``scaler.step``, is ``host._local_scalar_dense``).
"""

from __future__ import annotations

from nnperf.passes.costs.common import bind, distinct, listed
from nnperf.passes.costs.optimizer import foreach_launches
from nnperf.passes.costs.registry import OPTIMIZER, OpCost, register
from nnperf.trace.events import OpEvent

UNSCALE_FLOPS = 2  # isfinite test + multiply by inv_scale, per gradient element
UPDATE_SCALE_FLOPS = 1  # scale * growth (or backoff) factor


@register("aten._amp_foreach_non_finite_check_and_unscale_")
def _unscale(event: OpEvent) -> OpCost:
    args = bind(event)
    grads = listed(args["self"])
    elements = sum(t.numel for t in grads)
    return OpCost(
        OPTIMIZER,
        flops=float(UNSCALE_FLOPS * elements),
        reads=distinct(grads + listed(args["inv_scale"])),
        writes=distinct(grads),
        info={"tensors": len(grads), "launches": foreach_launches([t.numel for t in grads], 1)},
    )


@register("aten._amp_update_scale_")
def _update_scale(event: OpEvent) -> OpCost:
    args = bind(event)
    scale, tracker = listed(args["self"]), listed(args["growth_tracker"])
    return OpCost(
        OPTIMIZER,
        flops=float(UPDATE_SCALE_FLOPS),
        reads=distinct(scale + tracker + listed(args["found_inf"])),
        writes=distinct(scale + tracker),
        info={"tensors": 1, "launches": 1},
    )
