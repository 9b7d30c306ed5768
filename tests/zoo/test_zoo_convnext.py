"""ConvNeXt-T in timm's layout: parameters, FLOPs and a real tiny step."""

from __future__ import annotations

import itertools
import math

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils.flop_counter import FlopCounterMode

from nnperf.analysis import analyze
from nnperf.zoo import get_model


def count(module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_parameter_count_equals_timm():
    """timm ``convnext_tiny``: 28.59M in timm's benchmark CSVs, 28,589,128 from
    ``timm.create_model('convnext_tiny')``; the same number from the layer shapes by hand."""
    dims, depths = (96, 192, 384, 768), (3, 3, 9, 3)
    stem = 3 * 96 * 4 * 4 + 96 + 2 * 96  # 4x4 patch conv (bias), LayerNorm2d
    block = sum(depth * (49 * d + d + 2 * d + (d * 4 * d + 4 * d) + (4 * d * d + d) + d)
                for d, depth in zip(dims, depths, strict=True))  # dw7x7, LN, fc1, fc2, gamma
    down = sum(2 * cin + cin * cout * 4 + cout for cin, cout in itertools.pairwise(dims))
    head = 2 * 768 + 768 * 1000 + 1000
    assert stem + block + down + head == 28_589_128
    with FakeTensorMode():
        model = get_model("convnext_tiny").build(1, image_size=32).model
    assert count(model) == 28_589_128


def test_training_flops_equal_flop_counter(reference_training_flops):
    """FlopCounterMode with the grouped-conv backward fixed (``conftest.py``)."""
    a = analyze("convnext_tiny", batch=2, optimizer="sgd", image_size=64, num_classes=10)
    got = sum(op.flops for op in a.ops if op.category in ("gemm", "conv", "attention"))
    assert got == reference_training_flops("convnext_tiny", 2, image_size=64, num_classes=10)


def test_flop_counter_ignores_groups_in_the_weight_gradient():
    """Why conftest.py replaces torch's conv backward formula: for a depthwise conv torch
    counts the weight gradient ``channels`` times too high (torch 2.13)."""
    x = torch.randn(2, 8, 5, 5, requires_grad=True)
    conv = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False)
    with FlopCounterMode(display=False) as counter:
        conv(x).sum().backward()
    forward = 2 * 2 * 8 * 25 * 9  # 2 FLOPs x batch x channels x positions x taps
    assert counter.get_total_flops() == forward + forward + 8 * forward  # fwd, dx, dw x 8


def test_multiply_adds_match_the_paper():
    """Liu et al. (2022), Table 1/ImageNet-1K results: ConvNeXt-T 4.5G FLOPs at 224."""
    a = analyze("convnext_tiny", batch=1, train=False, optimizer="none")
    macs = sum(op.flops for op in a.ops if op.category in ("gemm", "conv")) / 2
    assert round(macs / 1e9, 1) == 4.5


def test_tiny_forward_backward_real():
    torch.manual_seed(0)
    w = get_model("convnext_tiny").build(2, image_size=32, num_classes=10)
    loss = w.loss_fn(w.model(*w.inputs))
    assert math.isfinite(loss.item())
    loss.backward()
    assert all(p.grad is not None for p in w.model.parameters())
