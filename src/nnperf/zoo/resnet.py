"""ResNet-18 and ResNet-50 in torchvision's layout (v1.5: stride on the 3x3 conv).

Names match torchvision (``conv1``, ``bn1``, ``layer1.0.conv1``, ``layer2.0.downsample.0``,
``fc``) so per-layer reports read like the model users already know.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from nnperf.workload import Workload

from ._options import require_positive, resolve_batch_seq, resolve_options
from ._spec import ModelSpec
from ._workloads import image_workload, require_image_size

DEFAULTS: dict[str, Any] = {"num_classes": 1000, "image_size": 224}
OPTIONS = {"num_classes": "number of output classes", "image_size": "input height and width"}


def conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


def conv1x1(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convs with a residual connection (ResNet-18/34)."""

    expansion = 1

    def __init__(
        self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (strided), 1x1 expand by 4 (ResNet-50 and deeper)."""

    expansion = 4

    def __init__(
        self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.conv1 = conv1x1(inplanes, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """``torchvision.models.ResNet`` without the zero-init and dilation options."""

    def __init__(
        self, block: type[BasicBlock | Bottleneck], layers: list[int], num_classes: int = 1000
    ) -> None:
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, 64, layers[0])
        self.layer2 = self._make_layer(block, 128, layers[1], stride=2)
        self.layer3 = self._make_layer(block, 256, layers[2], stride=2)
        self.layer4 = self._make_layer(block, 512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)

    def _make_layer(
        self, block: type[BasicBlock | Bottleneck], planes: int, blocks: int, stride: int = 1
    ) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                conv1x1(self.inplanes, planes * block.expansion, stride),
                nn.BatchNorm2d(planes * block.expansion),
            )
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


def _builder(name: str, block: type[BasicBlock | Bottleneck], layers: list[int]):
    def build(batch: int | None = None, seq_len: int | None = None, **overrides: Any) -> Workload:
        batch, _ = resolve_batch_seq(name, batch, seq_len, 64, None)
        config = resolve_options(name, overrides, DEFAULTS)
        require_positive(name, config, "num_classes")
        require_image_size(name, config["image_size"], 32)
        model = ResNet(block, layers, config["num_classes"])
        return image_workload(
            name, model, batch, config["image_size"], config["num_classes"], config
        )

    build.__doc__ = f"{name}: random RGB images, cross entropy against random labels."
    return build


RESNET18 = ModelSpec(
    name="resnet18",
    summary="ResNet-18 (torchvision layout), 224x224 RGB, 1000 classes",
    family="cnn",
    default_batch=64,
    default_seq=None,
    input_desc="3x224x224 float",
    options=OPTIONS,
    build=_builder("resnet18", BasicBlock, [2, 2, 2, 2]),
)

RESNET50 = ModelSpec(
    name="resnet50",
    summary="ResNet-50 v1.5 (torchvision layout), 224x224 RGB, 1000 classes",
    family="cnn",
    default_batch=64,
    default_seq=None,
    input_desc="3x224x224 float",
    options=OPTIONS,
    build=_builder("resnet50", Bottleneck, [3, 4, 6, 3]),
)
