"""The kernel models' call records read from traced events.

The models in ``nnperf.kernels`` take plain records of what a launch sees (shapes, dtypes,
layout, which gradients are asked for) so that they do not depend on the trace; this pass is
where an ``OpEvent``'s arguments become those records, following each ATen op's schema.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from nnperf.kernels import batch_norm, max_pool
from nnperf.kernels.batch_norm import BatchNormCall
from nnperf.kernels.depthwise import DepthwiseCall
from nnperf.kernels.max_pool import MaxPoolCall
from nnperf.trace.events import OpEvent, TensorMeta, dtype_name

#: Forward ops that always train or never do when no ``training`` argument says.
_TRAINS_BY_NAME = {
    "aten._native_batch_norm_legit_no_training": False,
    "aten._batch_norm_no_update": False,
    "aten._batch_norm_with_update": True,
    "aten._batch_norm_with_update_functional": True,
}

def _layout(t: TensorMeta) -> tuple[bool, bool]:
    """(channels-last, contiguous in some layout) of an N, C, ... tensor, as
    ``batch_norm_choose_impl`` decides: contiguous with stride 1 on C also counts as
    channels-last (C is then the innermost dimension)."""
    shape, stride = t.shape, t.stride
    if len(shape) < 2:
        return False, True

    def dense(order: list[int]) -> bool:
        expected = 1
        for d in reversed(order):
            if shape[d] != 1 and stride[d] != expected:
                return False
            expected *= shape[d]
        return True

    dims = list(range(len(shape)))
    if dense(dims):
        return stride[1] == 1 and shape[1] > 1, True
    last = [0, *dims[2:], 1]
    return dense(last), dense(last)


def batch_norm_call(event: OpEvent) -> BatchNormCall | None:
    """The call ``event`` makes, or None for an op of another form (no tensor input of at
    least two dimensions)."""
    backward = event.name in batch_norm.BACKWARD_OPS
    if not backward and event.name not in batch_norm.FORWARD_OPS:
        return None
    a = list(event.args) + [None] * 12
    kw = event.kwargs
    if backward:
        # native_batch_norm_backward(grad_out, input, weight, running_mean, running_var,
        #   save_mean, save_invstd, train, eps, output_mask)
        x, weight, running = a[1], a[2], a[3]
        training = bool(kw.get("train", a[7] if a[7] is not None else True))
        eps = kw.get("eps", a[8] if isinstance(a[8], float) else 1e-5)
        mask = kw.get("output_mask", a[9]) or [True, True, True]
        bias_present = weight is not None  # the backward does not see the bias: affine BN has both
    else:
        # native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)
        x, weight, bias, running = a[0], a[1], a[2], a[3]
        trains = a[5] if isinstance(a[5], bool) else _TRAINS_BY_NAME.get(event.name, True)
        training = bool(kw.get("training", trains))
        floats = [v for v in a[5:8] if isinstance(v, float)]
        eps = kw.get("eps", floats[-1] if floats else 1e-5)
        mask = [True, True, True]
        bias_present = isinstance(bias, TensorMeta)
    if not isinstance(x, TensorMeta) or len(x.shape) < 2:
        return None
    channels_last, contiguous = _layout(x)
    spatial = math.prod(x.shape[2:]) if len(x.shape) > 2 else 1
    return BatchNormCall(
        batch=x.shape[0], channels=x.shape[1], spatial=spatial, itemsize=x.itemsize,
        input_dtype=dtype_name(x.dtype),
        weight_dtype=dtype_name(weight.dtype) if isinstance(weight, TensorMeta) else None,
        has_bias=bias_present, running_stats=isinstance(running, TensorMeta), training=training,
        backward=backward, want_input_grad=bool(mask[0]), want_param_grads=bool(mask[1] or mask[2]),
        channels_last=channels_last, contiguous=contiguous, eps=float(eps), numel=x.numel,
    )


def depthwise_call(event: OpEvent) -> DepthwiseCall | None:
    """The call of a depthwise ``aten.convolution`` / ``convolution_backward`` event (the
    caller has checked ``passes.costs.matmul.is_depthwise``); None if it is not 4-D."""
    backward = event.name == "aten.convolution_backward"
    if backward:
        grad_out, x, w = event.args[0], event.args[1], event.args[2]
        mask = event.args[10]
        out_shape = grad_out.shape
    else:
        x, w = event.args[0], event.args[1]
        mask = [True, True, True]
        out_shape = event.outputs[0].shape
    if not isinstance(x, TensorMeta) or len(x.shape) != 4 or len(w.shape) != 4:
        return None
    return DepthwiseCall(
        batch=x.shape[0], channels=w.shape[0], input_positions=x.shape[2] * x.shape[3],
        output_positions=out_shape[2] * out_shape[3], taps=w.shape[2] * w.shape[3],
        itemsize=x.itemsize, dtype=dtype_name(x.dtype),
        channels_last=x.shape[1] > 1 and x.stride[1] == 1, backward=backward,
        want_input_grad=bool(mask[0]), want_weight_grad=bool(mask[1]),
    )


def _pair(value: Sequence[int] | int | None, default: Sequence[int]) -> tuple[int, int]:
    if value is None or (isinstance(value, (list, tuple)) and not value):
        return int(default[0]), int(default[-1])
    if isinstance(value, int):
        return value, value
    return int(value[0]), int(value[-1])


def max_pool_call(event: OpEvent) -> MaxPoolCall | None:
    """The call of a 2-D max pooling forward or backward event over a 4-D input; None else."""
    backward = event.name == max_pool.BACKWARD
    if not backward and event.name != max_pool.FORWARD:
        return None
    a = list(event.args) + [None] * 8
    # forward: (self, kernel_size, stride, padding, dilation, ceil_mode)
    # backward: (grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices)
    x = a[1] if backward else a[0]
    out = a[0] if backward else event.outputs[0]
    params = a[2:6] if backward else a[1:5]
    if not isinstance(x, TensorMeta) or not isinstance(out, TensorMeta) or len(x.shape) != 4:
        return None
    kernel = _pair(params[0], (1, 1))
    return MaxPoolCall(
        batch=x.shape[0], channels=x.shape[1], in_hw=(x.shape[2], x.shape[3]), out_hw=(out.shape[2], out.shape[3]),
        kernel=kernel, stride=_pair(params[1], kernel), padding=_pair(params[2], (0, 0)),
        dilation=_pair(params[3], (1, 1)), itemsize=x.itemsize,
        channels_last=x.shape[1] > 1 and x.stride[1] == 1, backward=backward,
    )
