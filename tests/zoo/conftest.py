"""A FlopCounterMode reference for training steps of grouped/depthwise convolutions.

PyTorch's ``convolution_backward`` formula (``torch.utils.flop_counter.conv_backward_flop``)
counts the weight gradient as if every input channel met every output channel, ignoring
``groups``: for a depthwise conv that is C times too many. ``test_flop_counter_ignores_groups``
pins that down; the reference below keeps torch's ``conv_flop_count`` for both gradients, each
a convolution with the forward's shapes (grad input: transposed conv of grad_out with the
weight; grad weight: one multiply-add per weight element, output position and sample).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.ops import aten
from torch.utils.flop_counter import FlopCounterMode, conv_flop_count

from nnperf.workload import default_loss
from nnperf.zoo import get_model


def conv_backward_flops(grad_out_shape, x_shape, w_shape, _bias, _stride, _padding, _dilation,
                        transposed, _output_padding, _groups, output_mask, **_kwargs) -> int:  # fmt: skip
    assert not transposed
    flops = 0
    if output_mask[0]:
        flops += conv_flop_count(grad_out_shape, w_shape, x_shape, transposed=True)
    if output_mask[1]:
        flops += conv_flop_count(x_shape, w_shape, grad_out_shape)
    return flops


def training_flops(name: str, batch: int, seq: int | None = None, **overrides) -> int:
    """Matmul/conv FLOPs of forward + loss + backward of a zoo workload, on fake tensors."""
    with FakeTensorMode():
        w = get_model(name).build(batch, seq, **overrides)
        w.model.train()
        mapping = {aten.convolution_backward: conv_backward_flops}
        with FlopCounterMode(display=False, custom_mapping=mapping) as counter:
            (w.loss_fn or default_loss)(w.model(*w.inputs)).backward()
    return counter.get_total_flops()


@pytest.fixture
def reference_training_flops() -> Callable[..., int]:
    return training_flops
