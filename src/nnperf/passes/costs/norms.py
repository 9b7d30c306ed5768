"""Layer, RMS, group and batch normalization, forward and backward.

Per-element FLOPs (statistics computed in one pass; per-row/per-channel scalar work such as
the rsqrt is negligible and left out):
- layer / group norm forward: mean 1 + variance 3 + normalize 2 = 6, +1 for a weight, +1 bias;
- RMS norm forward: sum of squares 2 + scale 1 = 3, +1 for a weight;
- batch norm forward, training: sum and sum of squares 3 + normalize 2 (+1 weight, +1 bias);
  in evaluation the statistics are given: normalize 2 (+1, +1);
- backward (layer, group, batch in training): x-hat 2, the two reductions 3, grad_input 5,
  +1 where a weight scales the gradient; grad_weight / grad_bias reuse the reductions
  (layer/group norm reduce over rows instead: +2 and +1 when requested).
Bytes: input, weight, bias and saved statistics read once; outputs (and running statistics
that training updates in place) written once: the traffic the op must have.

PyTorch's CUDA kernels read some inputs twice, since a normalization needs statistics over the
whole reduced extent before it can write one output element (``second_reads``; PyTorch
``aten/src/ATen/native/cuda/``, the same structure from 1.12 to 2.x):

- batch norm, training forward: ``batch_norm_stats`` (Welford over N*H*W per channel) reads the
  input, then ``batch_norm_elemt`` reads it again and writes the output (``Normalization.cu``,
  ``Normalization.cuh``; channels-last: the ``..._channels_last_kernel`` pair; cuDNN's NCHW
  kernel makes the same two sweeps inside one launch);
- batch norm, training backward: ``batch_norm_backward_reduce`` reads the output gradient and
  the input (sums of dy and dy * (x - mean)), then ``batch_norm_backward_elemt`` reads both
  again to write the input gradient;
- layer norm backward: the input gradient is row-local (``layer_norm_grad_input_kernel`` reads
  a row of dy and x once), but the weight and bias gradients reduce over rows in a kernel of
  their own (``GammaBetaBackwardCUDAKernel``, ``layer_norm_kernel.cu``) that reads dy and x again;
- group norm: ``RowwiseMomentsCUDAKernel`` reads x before the output pass; backward's
  ``ComputeInternalGradientsCUDAKernel`` reads dy and x before the input-gradient pass
  (``group_norm_kernel.cu``).

Layer and RMS norm forward keep a row in registers (``vectorized_layer_norm_kernel``): one
read. Evaluation-mode batch norm has its statistics: one elementwise pass. Whether a second
read reaches DRAM or finds the L2 is the time model's question (``passes.timing``).
"""

from __future__ import annotations

from typing import Any

from nnperf.passes.costs.common import bind, distinct, footprint, listed
from nnperf.passes.costs.registry import NORM, OpCost, register, written_args
from nnperf.trace.events import OpEvent, TensorMeta


def _present(*values: Any) -> list[TensorMeta]:
    return [footprint(t) for v in values for t in listed(v)]


def _mask(args: dict[str, Any], n: int) -> list[bool]:
    mask = args.get("output_mask")
    return [bool(m) for m in mask] if mask is not None else [True] * n


def _affine(args: dict[str, Any]) -> int:
    return int(args.get("weight") is not None) + int(args.get("bias") is not None)


@register("aten.native_layer_norm", "aten.native_group_norm")
def _layer_norm(event: OpEvent) -> OpCost:
    args = bind(event)
    x = args["input"]
    return OpCost(
        NORM,
        flops=float(x.numel * (6 + _affine(args))),
        reads=_present(x, args.get("weight"), args.get("bias")),
        writes=distinct(event.outputs),
    )


@register("aten.native_layer_norm_backward", "aten.native_group_norm_backward")
def _layer_norm_backward(event: OpEvent) -> OpCost:
    args = bind(event)
    x, weight = args["input"], args.get("weight")
    want_input, want_weight, want_bias = _mask(args, 3)
    per = 2 + (9 + int(weight is not None)) * want_input + 2 * want_weight + want_bias
    return OpCost(
        NORM,
        flops=float(x.numel * per),
        reads=_present(args["grad_out"], x, args["mean"], args["rstd"], weight),
        writes=distinct(event.outputs),
    )


@register("aten._fused_rms_norm", since="2.9")  # added in 2.8 or 2.9 (a later bound is safe)
def _rms_norm(event: OpEvent) -> OpCost:
    args = bind(event)
    x, weight = args["input"], args.get("weight")
    return OpCost(
        NORM,
        flops=float(x.numel * (3 + int(weight is not None))),
        reads=_present(x, weight),
        writes=distinct(event.outputs),
    )


@register("aten._fused_rms_norm_backward", since="2.9")
def _rms_norm_backward(event: OpEvent) -> OpCost:
    """x-hat 1, g*w 1, sum(g w x-hat) 2, grad_input 3; grad_weight: g*x-hat summed, 2."""
    args = bind(event)
    x, weight = args["input"], args.get("weight")
    want_input, want_weight = _mask(args, 2)
    per = 1 + 6 * want_input + 2 * want_weight
    return OpCost(
        NORM,
        flops=float(x.numel * per),
        reads=_present(args["grad_out"], x, args["rstd"], weight),
        writes=distinct(event.outputs),
    )


# Batch norm: which ops train (update running statistics) when no ``training`` argument says.
_BN_TRAINING_DEFAULT = {
    "aten._native_batch_norm_legit_no_training": False,
    "aten._batch_norm_no_update": False,
    "aten._batch_norm_with_update": True,
    "aten._batch_norm_with_update_functional": True,
}
# These update running statistics in place without saying so in their schema.
_BN_UNANNOTATED_UPDATE = {
    "aten.native_batch_norm",
    "aten.cudnn_batch_norm",
    "aten.miopen_batch_norm",
}


_BN_FORWARD = (
    "aten.native_batch_norm",
    "aten._native_batch_norm_legit",
    "aten._native_batch_norm_legit_functional",
    "aten._native_batch_norm_legit_no_training",
    "aten._batch_norm_with_update",
    "aten._batch_norm_with_update_functional",
    "aten._batch_norm_no_update",
    "aten.cudnn_batch_norm",
    "aten.miopen_batch_norm",
)
_BN_BACKWARD = (
    "aten.native_batch_norm_backward",
    "aten.batch_norm_backward",
    "aten.cudnn_batch_norm_backward",
    "aten.miopen_batch_norm_backward",
)


def _bn_forward_trains(name: str, args: dict[str, Any]) -> bool:
    """Whether a batch norm forward computes its statistics (and updates running ones)."""
    return bool(args.get("training", _BN_TRAINING_DEFAULT.get(name, True)))


def _bn_backward_trains(args: dict[str, Any]) -> bool:
    """Whether a batch norm backward differentiates through batch statistics."""
    return bool(args.get("train", args.get("update", True)))


def _bn_grad_output(args: dict[str, Any]) -> TensorMeta:
    """The output gradient (``grad_output`` in cuDNN's and MIOpen's schemas, else ``grad_out``)."""
    return args["grad_output"] if "grad_output" in args else args["grad_out"]


@register(*_BN_FORWARD)
def _batch_norm(event: OpEvent) -> OpCost:
    args = bind(event)
    x = args["input"]
    training = _bn_forward_trains(event.name, args)
    stats = _present(args.get("running_mean"), args.get("running_var"))
    per = (5 if training else 2) + _affine(args)
    writes = distinct(event.outputs) + written_args(event)
    if training and event.name in _BN_UNANNOTATED_UPDATE:
        writes += stats
    return OpCost(
        NORM,
        flops=float(x.numel * per),
        reads=_present(x, args.get("weight"), args.get("bias")) + stats,
        writes=distinct(writes),
        info={"training": bool(training)},
    )


@register(*_BN_BACKWARD)
def _batch_norm_backward(event: OpEvent) -> OpCost:
    args = bind(event)
    x, weight = args["input"], args.get("weight")
    training = _bn_backward_trains(args)
    want_input, want_weight, want_bias = _mask(args, 3)
    if training:
        per = 5 + (5 + int(weight is not None)) * want_input
        stats = _present(args.get("save_mean"), args.get("save_invstd", args.get("save_var")))
    else:  # statistics are constants: grad_input = g * w * invstd; grad_w/b are sums
        per = (1 + int(weight is not None)) * want_input + 3 * (want_weight or want_bias)
        stats = _present(args.get("running_mean"), args.get("running_var"))
    return OpCost(
        NORM,
        flops=float(x.numel * per),
        reads=_present(_bn_grad_output(args), x, weight) + stats,
        writes=distinct(event.outputs),
        info={"training": bool(training)},
    )


def second_reads(event: OpEvent) -> list[TensorMeta]:
    """The tensors ``event``'s CUDA kernels read a second time (module docstring), as the
    elements they hold (a broadcast gradient is its one element)."""
    name = event.name
    if name in _BN_FORWARD:
        args = bind(event)
        return _present(args["input"]) if _bn_forward_trains(name, args) else []
    if name in _BN_BACKWARD:
        args = bind(event)
        wants_input = _bn_backward_trains(args) and _mask(args, 3)[0]
        return _present(_bn_grad_output(args), args["input"]) if wants_input else []
    if name == "aten.native_layer_norm_backward":
        args = bind(event)
        want_input, want_weight, want_bias = _mask(args, 3)
        return _present(args["grad_out"], args["input"]) if want_input and (want_weight or want_bias) else []
    if name == "aten.native_group_norm":
        return _present(bind(event)["input"])
    if name == "aten.native_group_norm_backward":
        args = bind(event)
        return _present(args["grad_out"], args["input"]) if _mask(args, 3)[0] else []
    return []
