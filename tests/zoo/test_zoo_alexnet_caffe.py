"""The Caffe AlexNet's multiply-accumulates, computed by hand from observed layer shapes.

Reference figures: conv1 = 55*55*3*11*11*96 = 105,415,200 MACs, fc6 = 9216*4096 =
37,748,736, and 724,406,816 MACs over all conv and fc layers for one 227x227 image.
"""

from __future__ import annotations

from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from nnperf.zoo import get_model


def observe_layers() -> tuple[nn.Module, dict[str, tuple[int, ...]]]:
    shapes: dict[str, tuple[int, ...]] = {}
    with FakeTensorMode():
        w = get_model("alexnet-caffe").build(1)
        for name, module in w.model.named_modules():
            if name:
                module.register_forward_hook(
                    lambda _m, _i, out, name=name: shapes.__setitem__(name, tuple(out.shape))
                )
        w.model(*w.inputs)
    return w.model, shapes


def macs(module: nn.Module, out_shape: tuple[int, ...]) -> int:
    if isinstance(module, nn.Conv2d):
        _, c_out, h_out, w_out = out_shape
        kh, kw = module.kernel_size
        return h_out * w_out * c_out * (module.in_channels // module.groups) * kh * kw
    assert isinstance(module, nn.Linear)
    return module.in_features * module.out_features


def test_layer_names_and_shapes() -> None:
    model, shapes = observe_layers()
    names = {n for n, _ in model.named_modules()}
    assert {"conv1", "conv2", "conv3", "conv4", "conv5", "fc6", "fc7", "fc8"} <= names
    assert tuple(model.conv1.weight.shape) == (96, 3, 11, 11)
    assert [model.conv2.groups, model.conv3.groups, model.conv4.groups, model.conv5.groups] == [
        2,
        1,
        2,
        2,
    ]
    assert shapes["conv1"] == (1, 96, 55, 55)
    assert shapes["pool1"] == (1, 96, 27, 27)
    assert shapes["conv2"] == (1, 256, 27, 27)
    assert shapes["pool2"] == (1, 256, 13, 13)
    assert shapes["pool5"] == (1, 256, 6, 6)
    assert shapes["fc8"] == (1, 1000)
    assert isinstance(model.norm1, nn.LocalResponseNorm)
    assert (model.norm1.size, model.norm1.alpha, model.norm1.beta, model.norm1.k) == (
        5,
        1e-4,
        0.75,
        1.0,
    )


def test_macs_by_hand() -> None:
    model, shapes = observe_layers()
    layers = ["conv1", "conv2", "conv3", "conv4", "conv5", "fc6", "fc7", "fc8"]
    per_layer = {n: macs(model.get_submodule(n), shapes[n]) for n in layers}
    assert per_layer["conv1"] == 55 * 55 * 3 * 11 * 11 * 96 == 105_415_200
    assert per_layer["fc6"] == 9216 * 4096 == 37_748_736
    assert sum(per_layer.values()) == 724_406_816
