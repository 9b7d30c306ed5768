"""The ``Net`` from pytorch/examples mnist/main.py, the best-known small CNN in PyTorch."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nnperf.workload import Workload

from ._losses import NllLoss, random_classes
from ._options import require_positive, resolve_batch_seq, resolve_options
from ._spec import ModelSpec
from ._workloads import image_workload

DEFAULTS: dict[str, Any] = {"num_classes": 10}


class Net(nn.Module):
    """Same layers, names and order as the PyTorch example, ending in log_softmax."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


def build(batch: int | None = None, seq_len: int | None = None, **overrides: Any) -> Workload:
    """(batch, 1, 28, 28) images; nll_loss because the network already applies log_softmax."""
    batch, _ = resolve_batch_seq("mnist-cnn", batch, seq_len, SPEC.default_batch, None)
    config = resolve_options("mnist-cnn", overrides, DEFAULTS)
    require_positive("mnist-cnn", config, "num_classes")
    n = config["num_classes"]
    loss = NllLoss(random_classes(batch, n))
    return image_workload("mnist-cnn", Net(n), batch, 28, n, config, channels=1, loss_fn=loss)


SPEC = ModelSpec(
    name="mnist-cnn",
    summary="PyTorch examples MNIST CNN (2 conv + 2 fc, dropout, log_softmax), 28x28 gray",
    family="cnn",
    default_batch=64,
    default_seq=None,
    input_desc="1x28x28 float",
    options={"num_classes": "number of output classes"},
    build=build,
)
