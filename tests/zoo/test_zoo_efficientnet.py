"""EfficientNet-B0/B4 and WideSE as NVIDIA DeepLearningExamples builds them.

Expected parameter counts: DLE's own ``EfficientNet`` classes
(``PyTorch/Classification/ConvNets/image_classification/models/efficientnet.py`` at 7bdfc81d and
729963dd) instantiated and counted; B0 and B4 are also timm's ``efficientnet_b0`` (5.29M in
timm's benchmark CSV, 5,288,548 from ``timm.create_model``) and ``efficientnet_b4``
(19,341,616), and the paper's 5.3M / 19M (Tan & Le 2019, Table 2).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils.flop_counter import FlopCounterMode

from nnperf.analysis import analyze
from nnperf.errors import UsageError
from nnperf.zoo import get_model
from nnperf.zoo.efficientnet import MBConv, scale_depth, scale_width

PUBLISHED = {
    "efficientnet_b0": 5_288_548,
    "efficientnet_b4": 19_341_616,
    "efficientnet_widese_b0": 8_423_848,
    "efficientnet_widese_b4": 34_927_246,
}


def count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_count_equals_dle(name: str) -> None:
    with FakeTensorMode():
        w = get_model(name).build(1, image_size=32)
    assert count(w.model) == PUBLISHED[name]


def test_b4_scaling_matches_dle_arch():
    """DLE ``effnet_b0_layers.scale(wc=1.4, dc=1.8)``: these are the B4 stage widths and
    repeats DLE prints for ``efficientnet-b4`` (stem 48, head 1792)."""
    b0 = [16, 24, 40, 80, 112, 192, 320]
    assert [scale_width(c, 1.4) for c in b0] == [24, 32, 56, 112, 160, 272, 448]
    assert [scale_depth(r, 1.8) for r in [1, 2, 2, 3, 3, 4, 1]] == [2, 4, 4, 6, 6, 8, 2]
    assert (scale_width(32, 1.4), scale_width(1280, 1.4)) == (48, 1792)


def test_widese_sizes_se_from_the_expanded_width():
    with FakeTensorMode():
        plain = get_model("efficientnet_b0").build(1, image_size=32).model
        wide = get_model("efficientnet_widese_b0").build(1, image_size=32).model
    for a, b in zip(plain.modules(), wide.modules(), strict=True):
        if isinstance(a, MBConv):
            hidden = a.depsep.conv.out_channels
            cin = hidden if a.expand is None else a.expand.conv.in_channels
            assert a.se.squeeze.out_channels == max(1, int(cin * 0.25))
            assert b.se.squeeze.out_channels == max(1, int(hidden * 0.25))


def test_b4_stochastic_depth_schedule():
    """DLE: survival 1 - 0.2 * block_id / 32 on residual blocks; B4 has 32 blocks."""
    with FakeTensorMode():
        model = get_model("efficientnet_b4").build(1, image_size=32).model
    blocks = [m for m in model.modules() if isinstance(m, MBConv)]
    assert len(blocks) == 32
    assert blocks[-1].survival_prob == pytest.approx(1 - 0.2 * 31 / 32)
    assert all(b.survival_prob == 1.0 for b in blocks if not b.residual)
    with FakeTensorMode():
        b0 = get_model("efficientnet_b0").build(1, image_size=32).model
    assert all(m.survival_prob == 1.0 for m in b0.modules() if isinstance(m, MBConv))


@pytest.mark.parametrize("name", ["efficientnet_b4", "efficientnet_widese_b0"])
def test_training_flops_equal_flop_counter(name: str, reference_training_flops) -> None:
    """FlopCounterMode with the grouped-conv backward fixed (``conftest.py``)."""
    overrides = {"image_size": 64, "num_classes": 10}
    a = analyze(name, batch=2, optimizer="sgd", **overrides)
    got = sum(op.flops for op in a.ops if op.category in ("gemm", "conv", "attention"))
    assert got == reference_training_flops(name, 2, **overrides)


def test_inference_flops_equal_flop_counter() -> None:
    with FakeTensorMode():
        w = get_model("efficientnet_b0").build(2, image_size=64)
        w.model.eval()
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            w.model(*w.inputs)
    a = analyze("efficientnet_b0", batch=2, train=False, optimizer="none", image_size=64)
    got = sum(op.flops for op in a.ops if op.category in ("gemm", "conv", "attention"))
    assert got == counter.get_total_flops()


def test_b0_multiply_adds_match_the_paper():
    """Tan & Le (2019), Table 2: EfficientNet-B0 0.39B FLOPS (multiply-adds) at 224."""
    a = analyze("efficientnet_b0", batch=1, train=False, optimizer="none")
    macs = sum(op.flops for op in a.ops if op.category in ("gemm", "conv")) / 2
    assert round(macs / 1e9, 2) == 0.39


def test_tiny_forward_backward_real_in_training_mode():
    torch.manual_seed(0)
    w = get_model("efficientnet_b4").build(2, image_size=32, num_classes=10)
    loss = w.loss_fn(w.model(*w.inputs))
    assert math.isfinite(loss.item())
    loss.backward()
    assert all(p.grad is not None for p in w.model.parameters())


def test_bad_survival_prob():
    with pytest.raises(UsageError, match="survival_prob"):
        get_model("efficientnet_b4").build(1, survival_prob=0)
