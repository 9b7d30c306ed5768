"""Loss functions that run as their own kernels (cross entropy runs as log-softmax + NLL, or
as one fused kernel each way in a compiled loss, ``trace.loss``).

NLL forward gathers one log-probability per target, so it reads the targets and only those
elements of the input (plus the class weights they select); backward writes a full, mostly
zero grad_input with one value per target. Regression and binary losses are elementwise
maps followed by a reduction; FLOPs per element are listed in ``LOSS_FLOPS`` (forward) and
``LOSS_BACKWARD_FLOPS``, each counting the formula's arithmetic plus the reduction's add.
"""

from __future__ import annotations

import nnperf.trace.loss  # defines the nnperf:: ops registered below
import nnperf.trace.parallel.fused_vocab_parallel_loss  # noqa: F401  (and Megatron-Core's fused loss's)
from nnperf.passes.costs.common import bind, distinct, footprint, read_args, touched
from nnperf.passes.costs.registry import REDUCTION, OpCost, register, written_args
from nnperf.trace.events import OpEvent, TensorMeta

LOSS_FLOPS: dict[str, int] = {
    "mse_loss": 3,  # (x - y)^2, summed
    "l1_loss": 3,  # |x - y|, summed
    "smooth_l1_loss": 6,  # d = |x - y|; d < beta ? 0.5 d^2 / beta : d - 0.5 beta; summed
    "huber_loss": 6,
    "binary_cross_entropy": 9,  # -(t log x + (1 - t) log(1 - x)), logs clamped; summed
    "binary_cross_entropy_with_logits": 10,  # (1 - t) x + log1p(exp(-|x|)) + max(-x, 0)
    "soft_margin_loss": 5,  # log1p(exp(-y x)), summed
}
LOSS_BACKWARD_FLOPS: dict[str, int] = {
    "mse_loss_backward": 3,  # 2 (x - y) g / N
    "smooth_l1_loss_backward": 5,
    "huber_loss_backward": 5,
    "binary_cross_entropy_backward": 6,  # g (x - t) / max(x (1 - x), eps)
    "soft_margin_loss_backward": 6,
}


@register("aten.nll_loss_forward", "aten.nll_loss2d_forward")
def _nll_forward(event: OpEvent) -> OpCost:
    """Per target: gather, (weight multiply), negate and sum."""
    args = bind(event)
    x, target, weight = args["self"], args["target"], args.get("weight")
    n = target.numel
    reads = [target, touched(x, n)] + ([touched(weight, n)] if weight is not None else [])
    return OpCost(
        REDUCTION,
        flops=float(n * (3 if weight is not None else 2)),
        reads=reads,
        writes=distinct(event.outputs),
    )


@register("aten.nll_loss_backward", "aten.nll_loss2d_backward")
def _nll_backward(event: OpEvent) -> OpCost:
    """A zero-filled grad_input with -g * w / total_weight at each target: 2 FLOPs per target."""
    args = bind(event)
    grad, target, weight = args["grad_output"], args["target"], args.get("weight")
    n = target.numel
    reads = [grad, target, args["total_weight"]] + (
        [touched(weight, n)] if weight is not None else []
    )
    return OpCost(REDUCTION, flops=float(2 * n), reads=distinct(reads), writes=[event.outputs[0]])


def _elementwise_loss(event: OpEvent, per_element: int) -> OpCost:
    x = bind(event)["self"]
    return OpCost(
        REDUCTION,
        flops=float(per_element * footprint(x).numel),
        reads=read_args(event),
        writes=distinct(event.outputs),
    )


def _forward(event: OpEvent) -> OpCost:
    return _elementwise_loss(event, LOSS_FLOPS[event.name.removeprefix("aten.")])


def _backward(event: OpEvent) -> OpCost:
    return _elementwise_loss(event, LOSS_BACKWARD_FLOPS[event.name.removeprefix("aten.")])


register(*(f"aten.{name}" for name in LOSS_FLOPS))(_forward)
register(*(f"aten.{name}" for name in LOSS_BACKWARD_FLOPS))(_backward)


#: ``--loss compiled`` (``trace.loss``): inductor's kernels for cross entropy. Forward, per
#: logit: max, subtract, exp, add (online softmax, one read); label smoothing adds the row sum
#: of the logits. Per row: the log, the target's logit subtracted and the reduction's add.
#: Backward, per logit: exp(x - max - log_sum), the one-hot (or smoothing) subtraction and the
#: scale by the upstream gradient, as ``SOFTMAX_BACKWARD_FLOPS`` counts log-softmax's.
FUSED_CE_FLOPS, FUSED_CE_SMOOTHING_FLOPS, FUSED_CE_ROW_FLOPS = 4, 1, 3
FUSED_CE_BACKWARD_FLOPS = 4


@register("nnperf.cross_entropy")
def _fused_cross_entropy(event: OpEvent) -> OpCost:
    """One pass over the logits; the targets read, the row statistics and the loss written."""
    logits, target = event.args[0], event.args[1]
    smoothing = float(event.args[4])
    rows = target.numel
    per_logit = FUSED_CE_FLOPS + (FUSED_CE_SMOOTHING_FLOPS if smoothing else 0)
    return OpCost(
        REDUCTION,
        flops=float(per_logit * logits.numel + FUSED_CE_ROW_FLOPS * rows),
        reads=distinct([logits, target]),
        writes=distinct(event.outputs),
    )


@register("nnperf.cross_entropy_backward")
def _fused_cross_entropy_backward(event: OpEvent) -> OpCost:
    """The logits and row statistics read once, the gradient written once in the logits' dtype."""
    logits = event.args[1]
    return OpCost(
        REDUCTION,
        flops=float(FUSED_CE_BACKWARD_FLOPS * logits.numel),
        reads=distinct(t for t in event.args[:6] if isinstance(t, TensorMeta)),
        writes=[event.outputs[0]],
    )


#: Megatron-Core's fused cross entropy (``trace.parallel.fused_vocab_parallel_loss``), one kernel
#: per compiled function. FLOPs per logit: max (1); subtract, exp, sum (3); divide (1); in
#: backward scale (1). What each reads and writes is its arguments and results, and the fp32
#: copy it updates in place written back (``registry.written_args``).
MEGATRON_CE_FLOPS = {"nnperf.megatron_ce_max": 1, "nnperf.megatron_ce_exp": 3, "nnperf.megatron_ce_softmax": 1,
                     "nnperf.megatron_ce_gradient": 1}


@register(*MEGATRON_CE_FLOPS)
def _megatron_fused_cross_entropy(event: OpEvent) -> OpCost:
    """One pass over the logits: every tensor argument read, the results and the updated
    arguments written."""
    logits = event.args[0]
    return OpCost(
        REDUCTION,
        flops=float(MEGATRON_CE_FLOPS[event.name] * logits.numel),
        reads=read_args(event),
        writes=distinct([*written_args(event), *event.outputs]),
    )
