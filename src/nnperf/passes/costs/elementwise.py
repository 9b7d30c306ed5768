"""Pointwise ops: unary, binary and ternary maths with broadcasting, activations and their
backward ops, in-place and ``out=`` variants alike.

One rule covers every op PyTorch tags ``pointwise``; a short list adds the activation ops
that carry no tag. FLOPs = elements written x the per-element cost below; reads are each
operand at its own size (a broadcast bias is read once, not once per row), writes are the
written argument of an in-place op or the outputs.

Per-element costs count the textbook formula's arithmetic, each transcendental function
(exp, log, erf, tanh, sqrt...) as one operation: what a GPU issues, roughly, and what keeps
the numbers comparable across activations. Unlisted ops cost 1.
"""

from __future__ import annotations

import torch

from nnperf.passes.costs.common import (
    bind,
    distinct,
    is_scalar_bookkeeping,
    read_args,
)
from nnperf.passes.costs.registry import (
    ELEMENTWISE,
    HOST,
    Formula,
    OpCost,
    has_tag,
    register,
    register_rule,
    written_args,
)
from nnperf.trace.events import OpEvent

ELEMENT_FLOPS: dict[str, int] = {
    # forward activations
    "sigmoid": 4,  # 1 / (1 + exp(-x))
    "silu": 5,  # x * sigmoid(x)
    "gelu": 5,  # 0.5 * x * (1 + erf(x / sqrt 2));  tanh approximation: see below
    "softplus": 4,  # log1p(exp(beta x)) / beta, with a threshold compare
    "mish": 6,  # x * tanh(softplus(x))
    "elu": 4,
    "celu": 4,
    "selu": 5,
    "hardswish": 5,  # x * clamp(x + 3, 0, 6) / 6
    "hardsigmoid": 4,
    "hardtanh": 2,
    "clamp": 2,
    "leaky_relu": 2,
    "log_sigmoid_forward": 5,
    "logit": 3,
    "softshrink": 3,
    "hardshrink": 2,
    "_prelu_kernel": 2,
    "xlogy": 3,
    "logaddexp": 4,
    # ternary maths (optimizers use these)
    "lerp": 3,  # a + w * (b - a)
    "addcmul": 3,  # a + v * b * c
    "addcdiv": 3,  # a + v * b / c
    # backward ops: grad_output times the derivative
    "threshold_backward": 1,
    "gelu_backward": 11,
    "silu_backward": 9,
    "sigmoid_backward": 3,  # g * y * (1 - y)
    "tanh_backward": 3,  # g * (1 - y^2)
    "hardtanh_backward": 3,
    "leaky_relu_backward": 2,
    "elu_backward": 3,
    "softplus_backward": 5,
    "hardswish_backward": 5,
    "hardsigmoid_backward": 3,
    "mish_backward": 12,
    "log_sigmoid_backward": 6,
    "softshrink_backward": 3,
    "hardshrink_backward": 2,
    "logit_backward": 4,
    "native_dropout_backward": 2,  # g * mask * scale
    "_prelu_kernel_backward": 3,
    "rrelu_with_noise_backward": 2,
}
GELU_TANH_FLOPS = 9  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
GELU_TANH_BACKWARD_FLOPS = 14

# Elementwise ops PyTorch does not tag pointwise (checked against torch 2.13).
UNTAGGED_ELEMENTWISE = (
    "aten.hardtanh_backward",
    "aten.leaky_relu_backward",
    "aten.hardswish",
    "aten.hardswish_",
    "aten.hardswish_backward",
    "aten.hardsigmoid_backward",
    "aten.softplus_backward",
    "aten.mish_backward",
    "aten.elu_backward",
    "aten.log_sigmoid_forward",
    "aten.log_sigmoid_backward",
    "aten.gelu_",
    "aten.elu_",
    "aten.leaky_relu_",
    "aten.rsub",
    "aten.masked_fill_",
    "aten._prelu_kernel",
    "aten._prelu_kernel_backward",
    "aten.softshrink_backward",
    "aten.hardshrink_backward",
    "aten.rrelu_with_noise_backward",
    "aten.logit_backward",
    "aten.relu6",
    "aten.hardtanh_",
    "aten.floor_divide",  # MoE routing: token index = slot // top_k
    "aten.floor_divide_",
)


def base_name(name: str) -> str:
    """``aten._foreach_add_`` -> ``add``; ``aten.relu_`` -> ``relu``."""
    short = name.split(".", 1)[-1]
    short = short.removeprefix("_foreach_")
    if short.endswith("_") and not short.endswith("__"):
        short = short[:-1]
    return short


def element_flops(event: OpEvent) -> int:
    """Operations per element written, from the table plus what the arguments add."""
    base = base_name(event.name)
    args = bind(event)
    if base == "gelu" and args.get("approximate") == "tanh":
        return GELU_TANH_FLOPS
    if base == "gelu_backward" and args.get("approximate") == "tanh":
        return GELU_TANH_BACKWARD_FLOPS
    if base in ("clamp", "clip"):
        return sum(args.get(k) is not None for k in ("min", "max")) or 1
    if base == "pow":
        return _pow_flops(args.get("exponent"))
    if base in ("add", "sub") and args.get("alpha") not in (None, 1):
        return 2  # a + alpha * b
    return ELEMENT_FLOPS.get(base, 1)


def _pow_flops(exponent: object) -> int:
    """Small integer and half powers compile to multiplies or sqrt; others are exp(y log x)."""
    if isinstance(exponent, (int, float)) and not isinstance(exponent, bool):
        if exponent in (0.5, -0.5, -1, 1, 2):
            return 1
        if float(exponent).is_integer() and 0 < exponent <= 4:
            return int(exponent) - 1
    return 3


def host_cost(event: OpEvent) -> OpCost:
    """Scalar bookkeeping on the host: no device kernel, no device bytes."""
    return OpCost(HOST, info={"scalar": True})


def elementwise_cost(event: OpEvent) -> OpCost:
    """Elements written x per-element cost; each operand read once at its own size."""
    if is_scalar_bookkeeping(event):
        return host_cost(event)
    written = written_args(event)
    writes = distinct(written or event.outputs)
    elements = max((t.numel for t in writes), default=0)  # multi-output: one pass
    return OpCost(
        ELEMENTWISE,
        flops=float(elements * element_flops(event)),
        reads=read_args(event),
        writes=writes,
    )


register(*UNTAGGED_ELEMENTWISE)(elementwise_cost)


def _pointwise_rule(event: OpEvent) -> Formula | None:
    return elementwise_cost if has_tag(event, torch.Tag.pointwise) else None


register_rule(_pointwise_rule)


@register("aten.glu")
def _glu(event: OpEvent) -> OpCost:
    """a * sigmoid(b) over the two halves of the input: 5 per output element."""
    out = event.outputs[0]
    return OpCost(ELEMENTWISE, flops=5.0 * out.numel, reads=read_args(event), writes=[out])


@register("aten.glu_backward")
def _glu_backward(event: OpEvent) -> OpCost:
    """Both halves' gradients from one sigmoid: 8 per half-size element."""
    grad_in = event.outputs[0]
    return OpCost(ELEMENTWISE, flops=4.0 * grad_in.numel, reads=read_args(event), writes=[grad_in])


__all__ = ["ELEMENT_FLOPS", "base_name", "element_flops", "elementwise_cost", "host_cost"]
