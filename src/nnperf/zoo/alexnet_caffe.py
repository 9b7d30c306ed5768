"""The original AlexNet as shipped in Caffe's model zoo (bvlc_alexnet).

Unlike torchvision's variant it keeps the paper's 96/256/384/384/256 filters, the two-GPU
filter groups, local response normalisation and a 227x227 input. Layer names follow the
Caffe prototxt (conv1..conv5, fc6..fc8) so per-layer numbers can be checked against it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from nnperf.workload import Workload

from ._options import require_positive, resolve_batch_seq, resolve_options
from ._spec import ModelSpec
from ._workloads import image_workload

DEFAULTS: dict[str, Any] = {"num_classes": 1000}
IMAGE_SIZE = 227


class CaffeAlexNet(nn.Module):
    """bvlc_alexnet: conv-relu-lrn-pool twice, three convs, pool, three fc with dropout."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 96, kernel_size=11, stride=4)
        self.relu1 = nn.ReLU(inplace=True)
        self.norm1 = nn.LocalResponseNorm(5, alpha=1e-4, beta=0.75, k=1.0)
        self.pool1 = nn.MaxPool2d(kernel_size=3, stride=2)
        self.conv2 = nn.Conv2d(96, 256, kernel_size=5, padding=2, groups=2)
        self.relu2 = nn.ReLU(inplace=True)
        self.norm2 = nn.LocalResponseNorm(5, alpha=1e-4, beta=0.75, k=1.0)
        self.pool2 = nn.MaxPool2d(kernel_size=3, stride=2)
        self.conv3 = nn.Conv2d(256, 384, kernel_size=3, padding=1)
        self.relu3 = nn.ReLU(inplace=True)
        self.conv4 = nn.Conv2d(384, 384, kernel_size=3, padding=1, groups=2)
        self.relu4 = nn.ReLU(inplace=True)
        self.conv5 = nn.Conv2d(384, 256, kernel_size=3, padding=1, groups=2)
        self.relu5 = nn.ReLU(inplace=True)
        self.pool5 = nn.MaxPool2d(kernel_size=3, stride=2)
        self.fc6 = nn.Linear(256 * 6 * 6, 4096)
        self.relu6 = nn.ReLU(inplace=True)
        self.drop6 = nn.Dropout(0.5)
        self.fc7 = nn.Linear(4096, 4096)
        self.relu7 = nn.ReLU(inplace=True)
        self.drop7 = nn.Dropout(0.5)
        self.fc8 = nn.Linear(4096, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.pool1(self.norm1(self.relu1(self.conv1(x))))
        x = self.pool2(self.norm2(self.relu2(self.conv2(x))))
        x = self.relu3(self.conv3(x))
        x = self.relu4(self.conv4(x))
        x = self.pool5(self.relu5(self.conv5(x)))
        x = torch.flatten(x, 1)
        x = self.drop6(self.relu6(self.fc6(x)))
        x = self.drop7(self.relu7(self.fc7(x)))
        return self.fc8(x)


def build(batch: int | None = None, seq_len: int | None = None, **overrides: Any) -> Workload:
    """Fixed 227x227 input: fc6 expects exactly 6x6x256 features, as in Caffe."""
    batch, _ = resolve_batch_seq("alexnet-caffe", batch, seq_len, SPEC.default_batch, None)
    config = resolve_options("alexnet-caffe", overrides, DEFAULTS)
    require_positive("alexnet-caffe", config, "num_classes")
    model = CaffeAlexNet(config["num_classes"])
    return image_workload("alexnet-caffe", model, batch, IMAGE_SIZE, config["num_classes"], config)


SPEC = ModelSpec(
    name="alexnet-caffe",
    summary="Original AlexNet (Caffe bvlc_alexnet: groups=2, LRN), 227x227 RGB, 1000 classes",
    family="cnn",
    default_batch=128,
    default_seq=None,
    input_desc="3x227x227 float",
    options={"num_classes": "number of output classes"},
    build=build,
)
