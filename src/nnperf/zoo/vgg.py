"""VGG-16 (configuration "D") in torchvision's layout, without batch norm."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from nnperf.workload import Workload

from ._options import require_positive, resolve_batch_seq, resolve_options
from ._spec import ModelSpec
from ._workloads import image_workload, require_image_size

DEFAULTS: dict[str, Any] = {"num_classes": 1000, "image_size": 224}
CFG_D: list[int | str] = [
    64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M",
]  # fmt: skip


def make_features(cfg: list[int | str]) -> nn.Sequential:
    """3x3 convs with ReLU, "M" is a 2x2 max pool; indices match torchvision's ``features``."""
    layers: list[nn.Module] = []
    in_channels = 3
    for v in cfg:
        if v == "M":
            layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
        else:
            layers += [nn.Conv2d(in_channels, int(v), kernel_size=3, padding=1), nn.ReLU(True)]
            in_channels = int(v)
    return nn.Sequential(*layers)


class VGG(nn.Module):
    """``torchvision.models.VGG``: features, 7x7 adaptive average pool, 3-layer classifier."""

    def __init__(self, cfg: list[int | str], num_classes: int = 1000, dropout: float = 0.5):
        super().__init__()
        self.features = make_features(cfg)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096),
            nn.ReLU(True),
            nn.Dropout(p=dropout),
            nn.Linear(4096, 4096),
            nn.ReLU(True),
            nn.Dropout(p=dropout),
            nn.Linear(4096, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        x = self.features(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        return self.classifier(x)


def build(batch: int | None = None, seq_len: int | None = None, **overrides: Any) -> Workload:
    """Random RGB images; five 2x pools need at least 32 pixels."""
    batch, _ = resolve_batch_seq("vgg16", batch, seq_len, SPEC.default_batch, None)
    config = resolve_options("vgg16", overrides, DEFAULTS)
    require_positive("vgg16", config, "num_classes")
    require_image_size("vgg16", config["image_size"], 32)
    model = VGG(CFG_D, config["num_classes"])
    return image_workload(
        "vgg16", model, batch, config["image_size"], config["num_classes"], config
    )


SPEC = ModelSpec(
    name="vgg16",
    summary="VGG-16 (torchvision layout, no batch norm), 224x224 RGB, 1000 classes",
    family="cnn",
    default_batch=64,
    default_seq=None,
    input_desc="3x224x224 float",
    options={"num_classes": "number of output classes", "image_size": "input height and width"},
    build=build,
)
