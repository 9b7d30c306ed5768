"""AlexNet in torchvision's layout (the one-GPU variant with 64/192/384/256/256 filters)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from nnperf.workload import Workload

from ._options import require_positive, resolve_batch_seq, resolve_options
from ._spec import ModelSpec
from ._workloads import image_workload, require_image_size

DEFAULTS: dict[str, Any] = {"num_classes": 1000, "image_size": 224}


class AlexNet(nn.Module):
    """``torchvision.models.AlexNet``: features, 6x6 adaptive average pool, classifier."""

    def __init__(self, num_classes: int = 1000, dropout: float = 0.5) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, kernel_size=11, stride=4, padding=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(64, 192, kernel_size=5, padding=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(192, 384, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(384, 256, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(256, 256, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
        )
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
        self.classifier = nn.Sequential(
            nn.Dropout(p=dropout),
            nn.Linear(256 * 6 * 6, 4096),
            nn.ReLU(inplace=True),
            nn.Dropout(p=dropout),
            nn.Linear(4096, 4096),
            nn.ReLU(inplace=True),
            nn.Linear(4096, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        x = self.features(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        return self.classifier(x)


def build(batch: int | None = None, seq_len: int | None = None, **overrides: Any) -> Workload:
    """Random RGB images of ``image_size`` (63 is the smallest that survives the pools)."""
    batch, _ = resolve_batch_seq("alexnet", batch, seq_len, SPEC.default_batch, None)
    config = resolve_options("alexnet", overrides, DEFAULTS)
    require_positive("alexnet", config, "num_classes")
    require_image_size("alexnet", config["image_size"], 63)
    model = AlexNet(config["num_classes"])
    return image_workload(
        "alexnet", model, batch, config["image_size"], config["num_classes"], config
    )


SPEC = ModelSpec(
    name="alexnet",
    summary="AlexNet (torchvision layout), 224x224 RGB, 1000 classes",
    family="cnn",
    default_batch=128,
    default_seq=None,
    input_desc="3x224x224 float",
    options={"num_classes": "number of output classes", "image_size": "input height and width"},
    build=build,
)
