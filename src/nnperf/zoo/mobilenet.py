"""MobileNetV2 in torchvision's layout (inverted residuals, depthwise 3x3, ReLU6)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nnperf.workload import Workload

from ._options import require_positive, resolve_batch_seq, resolve_options
from ._spec import ModelSpec
from ._workloads import image_workload, require_image_size

DEFAULTS: dict[str, Any] = {"num_classes": 1000, "image_size": 224}

# expansion t, output channels c, repeats n, first stride s (the paper's Table 2)
SETTINGS = [[1, 16, 1, 1], [6, 24, 2, 2], [6, 32, 3, 2], [6, 64, 4, 2],
            [6, 96, 3, 1], [6, 160, 3, 2], [6, 320, 1, 1]]  # fmt: skip


class ConvBNReLU6(nn.Sequential):
    """Conv (no bias), BatchNorm, ReLU6 — torchvision's ``Conv2dNormActivation`` for this net."""

    def __init__(self, cin: int, cout: int, kernel: int = 3, stride: int = 1, groups: int = 1):
        super().__init__(
            nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU6(inplace=True),
        )


class InvertedResidual(nn.Module):
    """Expand 1x1, depthwise 3x3, project 1x1 (linear); residual when shapes allow."""

    def __init__(self, inp: int, oup: int, stride: int, expand_ratio: int) -> None:
        super().__init__()
        hidden = round(inp * expand_ratio)
        self.use_res_connect = stride == 1 and inp == oup
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(ConvBNReLU6(inp, hidden, kernel=1))
        layers += [
            ConvBNReLU6(hidden, hidden, stride=stride, groups=hidden),
            nn.Conv2d(hidden, oup, 1, 1, 0, bias=False),
            nn.BatchNorm2d(oup),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.conv(x) if self.use_res_connect else self.conv(x)


class MobileNetV2(nn.Module):
    """``torchvision.models.MobileNetV2`` at width multiplier 1.0."""

    def __init__(self, num_classes: int = 1000, dropout: float = 0.2) -> None:
        super().__init__()
        channels, last = 32, 1280
        features: list[nn.Module] = [ConvBNReLU6(3, channels, stride=2)]
        for t, c, n, s in SETTINGS:
            for i in range(n):
                features.append(InvertedResidual(channels, c, s if i == 0 else 1, t))
                channels = c
        features.append(ConvBNReLU6(channels, last, kernel=1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(p=dropout), nn.Linear(last, num_classes))

    def forward(self, x: Tensor) -> Tensor:
        x = self.features(x)
        x = torch.flatten(F.adaptive_avg_pool2d(x, (1, 1)), 1)
        return self.classifier(x)


def build(batch: int | None = None, seq_len: int | None = None, **overrides: Any) -> Workload:
    """Random RGB images; the network downsamples by 32, so at least 32 pixels."""
    batch, _ = resolve_batch_seq("mobilenet_v2", batch, seq_len, SPEC.default_batch, None)
    config = resolve_options("mobilenet_v2", overrides, DEFAULTS)
    require_positive("mobilenet_v2", config, "num_classes")
    require_image_size("mobilenet_v2", config["image_size"], 32)
    model = MobileNetV2(config["num_classes"])
    return image_workload(
        "mobilenet_v2", model, batch, config["image_size"], config["num_classes"], config
    )


SPEC = ModelSpec(
    name="mobilenet_v2",
    summary="MobileNetV2 1.0 (torchvision layout), 224x224 RGB, 1000 classes",
    family="cnn",
    default_batch=64,
    default_seq=None,
    input_desc="3x224x224 float",
    options={"num_classes": "number of output classes", "image_size": "input height and width"},
    build=build,
)
