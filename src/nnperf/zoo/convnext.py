"""ConvNeXt-T in timm's layout (``timm.models.convnext.convnext_tiny``, 28,589,128 parameters).

Written from timm ``timm/models/convnext.py`` and ``timm/layers/norm.py`` (commit aa4b5850,
the commit the published rows in ``validation/published/timm-benchmark.toml`` were read at;
the block is unchanged since the 2022 code that produced the training CSV):

- stem: 4x4 stride-4 conv (bias) then ``LayerNorm2d`` (eps 1e-6): permute to NHWC,
  ``F.layer_norm`` over channels, permute back;
- four stages, depths (3, 3, 9, 3), widths (96, 192, 384, 768); stages 2-4 start with
  ``LayerNorm2d`` + 2x2 stride-2 conv (bias);
- block (``conv_mlp=False``, timm's default): depthwise 7x7 conv (bias), permute to NHWC,
  ``LayerNorm`` (eps 1e-6), ``Linear`` to 4x width, GELU (erf), ``Linear`` back, permute to
  NCHW, layer scale (``x.mul(gamma.reshape(1, -1, 1, 1))``, init 1e-6), residual add;
- head (``head_norm_first=False``): global average pool, ``LayerNorm2d``, flatten, linear.

Stochastic depth (``drop_path_rate``) defaults to 0 in timm, so ``drop_path`` is an
``nn.Identity``; it would cost nothing at eval anyway. The MLP dropouts are 0, which PyTorch
skips without a kernel, so none are built.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nnperf.workload import Workload

from ._options import require_positive, resolve_batch_seq, resolve_options
from ._spec import ModelSpec
from ._workloads import image_workload, require_image_size

DEPTHS = (3, 3, 9, 3)
DIMS = (96, 192, 384, 768)
EPS = 1e-6
LAYER_SCALE_INIT = 1e-6
DEFAULTS: dict[str, Any] = {"num_classes": 1000, "image_size": 224}


class LayerNorm2d(nn.LayerNorm):
    """timm's ``LayerNorm2d``: LayerNorm over the channels of an NCHW tensor via NHWC."""

    def __init__(self, channels: int) -> None:
        super().__init__(channels, eps=EPS)

    def forward(self, x: Tensor) -> Tensor:
        x = F.layer_norm(x.permute(0, 2, 3, 1), self.normalized_shape, self.weight, self.bias,
                         self.eps)  # fmt: skip
        return x.permute(0, 3, 1, 2)


class Mlp(nn.Module):
    """timm's ``Mlp`` on NHWC tensors: Linear, GELU, Linear."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    """timm's ``ConvNeXtBlock`` with ``conv_mlp=False``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.conv_dw = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=EPS)
        self.mlp = Mlp(dim, 4 * dim)
        self.gamma = nn.Parameter(LAYER_SCALE_INIT * torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        shortcut = x
        x = self.conv_dw(x).permute(0, 2, 3, 1)
        x = self.mlp(self.norm(x)).permute(0, 3, 1, 2)
        return x.mul(self.gamma.reshape(1, -1, 1, 1)) + shortcut


class Stage(nn.Module):
    """Optional downsample (LayerNorm2d + 2x2 stride-2 conv), then the blocks."""

    def __init__(self, cin: int, cout: int, depth: int, downsample: bool) -> None:
        super().__init__()
        self.downsample: nn.Module = (
            nn.Sequential(LayerNorm2d(cin), nn.Conv2d(cin, cout, 2, stride=2))
            if downsample else nn.Identity()
        )  # fmt: skip
        self.blocks = nn.Sequential(*(Block(cout) for _ in range(depth)))

    def forward(self, x: Tensor) -> Tensor:
        return self.blocks(self.downsample(x))


class Head(nn.Module):
    """timm's ``NormMlpClassifierHead`` without a hidden layer: pool, LayerNorm2d, flatten, fc."""

    def __init__(self, dim: int, num_classes: int) -> None:
        super().__init__()
        self.global_pool = nn.AdaptiveAvgPool2d(1)
        self.norm = LayerNorm2d(dim)
        self.fc = nn.Linear(dim, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.norm(self.global_pool(x)).flatten(1))


class ConvNeXt(nn.Module):
    """``timm.create_model("convnext_tiny")`` (depths and widths are arguments for tests)."""

    def __init__(self, num_classes: int = 1000, depths: tuple[int, ...] = DEPTHS,
                 dims: tuple[int, ...] = DIMS) -> None:  # fmt: skip
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, dims[0], 4, stride=4), LayerNorm2d(dims[0]))
        cins = (dims[0], *dims[:-1])
        self.stages = nn.Sequential(
            *(Stage(cin, cout, depth, downsample=i > 0)
              for i, (cin, cout, depth) in enumerate(zip(cins, dims, depths, strict=True)))
        )  # fmt: skip
        self.head = Head(dims[-1], num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.stages(self.stem(x)))


def build(batch: int | None = None, seq_len: int | None = None, **overrides: Any) -> Workload:
    """Random RGB images; the network downsamples by 32, so at least 32 pixels."""
    batch, _ = resolve_batch_seq("convnext_tiny", batch, seq_len, SPEC.default_batch, None)
    config = resolve_options("convnext_tiny", overrides, DEFAULTS)
    require_positive("convnext_tiny", config, "num_classes")
    require_image_size("convnext_tiny", config["image_size"], 32)
    model = ConvNeXt(config["num_classes"])
    return image_workload(
        "convnext_tiny", model, batch, config["image_size"], config["num_classes"], config
    )


SPEC = ModelSpec(
    name="convnext_tiny",
    summary="ConvNeXt-T (timm layout: LayerNorm, depthwise 7x7, layer scale), 224x224 RGB",
    family="cnn",
    default_batch=64,
    default_seq=None,
    input_desc="3x224x224 float",
    options={"num_classes": "number of output classes", "image_size": "input height and width"},
    build=build,
)
