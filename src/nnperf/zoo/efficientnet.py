"""EfficientNet-B0/B4 and NVIDIA's WideSE variants, as DeepLearningExamples builds them.

Written from NVIDIA DeepLearningExamples ``PyTorch/Classification/ConvNets/image_classification/
models/efficientnet.py`` and ``common.py`` at commit 7bdfc81d (2021-04-20), the commit that
last updated the performance tables in ``validation/published/dle-efficientnet.toml`` (NGC
21.03), so the traced ops are the ones that were timed:

- B0's stage table (kernel, stride, repeats, expansion, channels), stem 32, head 1280, SE ratio
  0.25; B4 scales it with width 1.4 / depth 1.8 (``EffNetArch.scale``: channels rounded to a
  multiple of 8, never more than 10% down; repeats rounded up), default image 380 (B0: 224).
- MBConv: 1x1 expand (absent when the expansion is 1), depthwise kxk, squeeze-and-excitation,
  1x1 projection; every conv without bias, BatchNorm (eps 1e-3, momentum 0.01), SiLU.
- SE: average pool, 1x1 conv (bias) to the squeeze width, SiLU, 1x1 conv (bias), sigmoid,
  multiply. The squeeze width is ``int(in_channels * 0.25)``; NVIDIA's *WideSE* variants
  (``widese_mbconv``: ``squeeze_hidden=True``) take ``int(hidden * 0.25)`` instead, the only
  difference, which makes the SE convolutions ``expansion`` times wider.
- Head: 1x1 conv to the feature width, BN, SiLU, average pool, dropout (0.2 B0, 0.4 B4), linear.
- Stochastic depth (drop-connect): B4 trains with survival probability 0.8, decaying linearly
  with the block index. At that commit the keep/drop draw is made on the host for the whole
  batch and the residual is ``torch.add(x, b, alpha=0 or 1/p)``: the same single add as
  without it, so it costs nothing in training or inference (later commits draw the mask on the
  device and use ``addcmul``, and compute SE with ``Linear`` on the spatial mean: same
  parameters and FLOPs).

Parameter counts (DLE's own classes counted at HEAD 729963dd, whose shapes are the same):
B0 5,288,548, B4 19,341,616, WideSE-B0 8,423,848, WideSE-B4 34,927,246. B0 is also timm's
``efficientnet_b0`` (5.29M, same blocks, SE on the block input width; BN eps 1e-5 there, which
costs the same), so timm's benchmark rows use this model too.
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from nnperf.errors import ModelOptionError
from nnperf.workload import Workload

from ._options import require_positive, resolve_batch_seq, resolve_options
from ._spec import ModelSpec
from ._workloads import image_workload, require_image_size

# B0 (DLE ``effnet_b0_layers``): one column per stage.
KERNEL = [3, 3, 5, 3, 5, 5, 3]
STRIDE = [1, 2, 2, 2, 1, 2, 1]
REPEATS = [1, 2, 2, 3, 3, 4, 1]
EXPANSION = [1, 6, 6, 6, 6, 6, 6]
CHANNELS = [16, 24, 40, 80, 112, 192, 320]
STEM, FEATURES, SE_RATIO = 32, 1280, 0.25
BN_EPS, BN_MOMENTUM = 1e-3, 0.01


@dataclass(frozen=True)
class Variant:
    """One DLE architecture: ``effnet_b0_layers.scale(wc, dc, dis)`` and its ``EffNetParams``."""

    width: float
    depth: float
    image_size: int
    dropout: float
    survival_prob: float
    widese: bool


VARIANTS = {
    "efficientnet_b0": Variant(1.0, 1.0, 224, 0.2, 1.0, widese=False),
    "efficientnet_b4": Variant(1.4, 1.8, 380, 0.4, 0.8, widese=False),
    "efficientnet_widese_b0": Variant(1.0, 1.0, 224, 0.2, 1.0, widese=True),
    "efficientnet_widese_b4": Variant(1.4, 1.8, 380, 0.4, 0.8, widese=True),
}


def scale_width(channels: int, width: float, divisor: int = 8) -> int:
    """DLE's ``EffNetArch._scale_width`` (the TF reference's ``round_filters``)."""
    scaled = channels * width
    rounded = max(divisor, int(scaled + divisor / 2) // divisor * divisor)
    if rounded < 0.9 * scaled:
        rounded += divisor
    return rounded


def scale_depth(repeats: int, depth: float) -> int:
    """DLE's ``EffNetArch._scale_depth``: round up."""
    return math.ceil(repeats * depth)


def conv_bn_act(
    cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1, act: bool = True
) -> nn.Sequential:
    """DLE's ``LayerBuilder.conv(..., bn=True, act=...)``: conv without bias, BN, SiLU."""
    layers: list[tuple[str, nn.Module]] = [
        (
            "conv",
            nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
        ),
        ("bn", nn.BatchNorm2d(cout, eps=BN_EPS, momentum=BN_MOMENTUM)),
    ]
    if act:
        layers.append(("act", nn.SiLU(inplace=True)))
    return nn.Sequential(OrderedDict(layers))


class SqueezeExcitation(nn.Module):
    """DLE's ``SequentialSqueezeAndExcitation``: x * sigmoid(expand(silu(squeeze(pool(x)))))."""

    def __init__(self, channels: int, squeeze: int) -> None:
        super().__init__()
        self.pooling = nn.AdaptiveAvgPool2d(1)
        self.squeeze = nn.Conv2d(channels, squeeze, 1)
        self.activation = nn.SiLU(inplace=True)
        self.expand = nn.Conv2d(squeeze, channels, 1)
        self.sigmoid = nn.Sigmoid()

    def forward(self, x: Tensor) -> Tensor:
        gate = self.expand(self.activation(self.squeeze(self.pooling(x))))
        return self.sigmoid(gate) * x


class Flatten(nn.Module):
    """DLE's ``Flatten``: (B, C, 1, 1) -> (B, C) by two squeezes (views, no kernel)."""

    def forward(self, x: Tensor) -> Tensor:
        return x.squeeze(-1).squeeze(-1)


class MBConv(nn.Module):
    """DLE's ``MBConvBlock``; ``widese`` sizes the SE squeeze from the expanded width."""

    def __init__(
        self,
        kernel: int,
        cin: int,
        cout: int,
        expansion: int,
        stride: int,
        survival_prob: float,
        widese: bool,
    ) -> None:
        super().__init__()
        self.residual = stride == 1 and cin == cout
        hidden = cin * expansion
        squeeze = max(1, int((hidden if widese else cin) * SE_RATIO))
        self.expand = None if hidden == cin else conv_bn_act(cin, hidden, 1)
        self.depsep = conv_bn_act(hidden, hidden, kernel, stride, groups=hidden)
        self.se = SqueezeExcitation(hidden, squeeze)
        self.proj = conv_bn_act(hidden, cout, 1, act=False)
        self.survival_prob = survival_prob

    def forward(self, x: Tensor) -> Tensor:
        out = self.proj(self.se(self.depsep(x if self.expand is None else self.expand(x))))
        if not self.residual:
            return out
        factor = 1.0
        if self.training and self.survival_prob < 1.0:  # one host-side draw for the batch
            factor = (
                0.0 if random.uniform(0.0, 1.0) > self.survival_prob else 1 / self.survival_prob
            )
        return torch.add(x, out, alpha=factor)


class EfficientNet(nn.Module):
    """DLE's ``EfficientNet`` (stem, seven MBConv stages, 1x1 head, classifier)."""

    def __init__(
        self, variant: Variant, num_classes: int = 1000, survival_prob: float | None = None
    ) -> None:
        super().__init__()
        survival = variant.survival_prob if survival_prob is None else survival_prob
        repeats = [scale_depth(r, variant.depth) for r in REPEATS]
        channels = [scale_width(c, variant.width) for c in CHANNELS]
        stem, features = scale_width(STEM, variant.width), scale_width(FEATURES, variant.width)
        total_blocks = sum(repeats)
        self.stem = conv_bn_act(3, stem, 3, stride=2)
        stages: list[nn.Module] = []
        cin, block_id = stem, 0
        for kernel, stride, n, expansion, cout in zip(
            KERNEL, STRIDE, repeats, EXPANSION, channels, strict=True
        ):
            blocks = []
            for i in range(n):
                # DLE ``_get_survival_prob``: 1 - drop_rate * block_id / num_blocks; a first
                # block that changes shape has no residual and keeps survival 1.
                s = 1.0 - (1.0 - survival) * block_id / total_blocks
                first = i == 0
                if first and not (stride == 1 and cin == cout):
                    s = 1.0
                blocks.append(
                    (
                        f"block{i}",
                        MBConv(
                            kernel,
                            cin if first else cout,
                            cout,
                            expansion,
                            stride if first else 1,
                            s,
                            variant.widese,
                        ),
                    )
                )
                block_id += 1
            stages.append(nn.Sequential(OrderedDict(blocks)))
            cin = cout
        self.layers = nn.Sequential(*stages)
        self.features = conv_bn_act(cin, features, 1)
        self.classifier = nn.Sequential(
            OrderedDict(
                [
                    ("pooling", nn.AdaptiveAvgPool2d(1)),
                    ("squeeze", Flatten()),
                    ("dropout", nn.Dropout(variant.dropout)),
                    ("fc", nn.Linear(features, num_classes)),
                ]
            )
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(self.layers(self.stem(x))))


OPTIONS = {
    "num_classes": "number of output classes",
    "image_size": "input height and width",
    "survival_prob": "stochastic-depth survival probability of the last block (1: off)",
}


def _builder(name: str, variant: Variant):
    defaults: dict[str, Any] = {
        "num_classes": 1000,
        "image_size": variant.image_size,
        "survival_prob": variant.survival_prob,
    }

    def build(batch: int | None = None, seq_len: int | None = None, **overrides: Any) -> Workload:
        batch, _ = resolve_batch_seq(name, batch, seq_len, 64, None)
        config = resolve_options(name, overrides, defaults)
        require_positive(name, config, "num_classes")
        require_image_size(name, config["image_size"], 32)
        if not 0.0 < config["survival_prob"] <= 1.0:
            raise ModelOptionError(
                f"{name}: survival_prob must be in (0, 1], got {config['survival_prob']}"
            )
        model = EfficientNet(variant, config["num_classes"], config["survival_prob"])
        return image_workload(
            name, model, batch, config["image_size"], config["num_classes"], config
        )

    build.__doc__ = f"{name}: random RGB images, cross entropy against random labels."
    return build


def _spec(name: str, summary: str) -> ModelSpec:
    size = VARIANTS[name].image_size
    return ModelSpec(
        name=name,
        summary=f"{summary}, {size}x{size} RGB, 1000 classes",
        family="cnn",
        default_batch=64,
        default_seq=None,
        input_desc=f"3x{size}x{size} float",
        options=OPTIONS,
        build=_builder(name, VARIANTS[name]),
    )


SPECS = [
    _spec("efficientnet_b0", "EfficientNet-B0 (NVIDIA DeepLearningExamples; = timm's)"),
    _spec("efficientnet_b4", "EfficientNet-B4 (NVIDIA DeepLearningExamples, stochastic depth)"),
    _spec("efficientnet_widese_b0", "EfficientNet-WideSE-B0 (NVIDIA: SE on the expanded width)"),
    _spec("efficientnet_widese_b4", "EfficientNet-WideSE-B4 (NVIDIA: SE on the expanded width)"),
]
