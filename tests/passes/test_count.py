"""Counting pass: the Caffe AlexNet worked example by hand, and never a silent zero."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nnperf.analysis import analyze


@pytest.fixture(scope="module")
def alexnet():
    return analyze("alexnet-caffe", batch=1, train=False)


def test_alexnet_conv1_and_fc6_macs(alexnet):
    rows = {r.name: r for r in alexnet.modules()}
    assert rows["conv1"].tally.macs == 55 * 55 * 3 * 11 * 11 * 96 == 105_415_200
    assert rows["conv1"].tally.flops == 2 * 105_415_200
    assert rows["fc6"].tally.macs == 6 * 6 * 256 * 4096 == 37_748_736


def test_alexnet_conv_plus_fc_macs_and_parameters(alexnet):
    # conv2, conv4, conv5 are two-group convolutions: each group sees half the input channels
    conv = {
        "conv1": 55 * 55 * 96 * (3 * 11 * 11),
        "conv2": 27 * 27 * 256 * (48 * 5 * 5),
        "conv3": 13 * 13 * 384 * (256 * 3 * 3),
        "conv4": 13 * 13 * 384 * (192 * 3 * 3),
        "conv5": 13 * 13 * 256 * (192 * 3 * 3),
    }
    fc = {"fc6": 9216 * 4096, "fc7": 4096 * 4096, "fc8": 4096 * 1000}
    assert sum(conv.values()) + sum(fc.values()) == 724_406_816
    rows = {r.name: r for r in alexnet.modules()}
    for name, macs in {**conv, **fc}.items():
        assert rows[name].tally.macs == macs, name
    # MACs come from convolutions and products only (pooling, LRN, ReLU have none)
    assert alexnet.totals["macs"] == 724_406_816
    assert alexnet.totals["params"] == 60_965_224
    assert rows[""].params == 60_965_224


def test_alexnet_conv1_bytes(alexnet):
    conv1 = next(r for r in alexnet.modules() if r.name == "conv1").tally
    assert conv1.bytes_in / 4 == 227 * 227 * 3 == 154_587
    assert conv1.bytes_weights / 4 == 34_848 + 96 == 34_944
    assert conv1.bytes_out / 4 == 55 * 55 * 96 == 290_400


def test_alexnet_conv1_bandwidth_to_stay_compute_bound(alexnet):
    """The worked example: at 120 TFLOP/s conv1 takes 1.757 us and needs ~352/661/80 GB/s."""
    conv1 = next(r for r in alexnet.modules() if r.name == "conv1").tally
    seconds = conv1.flops / 120e12
    assert seconds == pytest.approx(1.757e-6, rel=1e-3)
    assert conv1.bytes_in / seconds / 1e9 == pytest.approx(352, rel=5e-3)
    assert conv1.bytes_out / seconds / 1e9 == pytest.approx(661, rel=5e-3)
    assert conv1.bytes_weights / seconds / 1e9 == pytest.approx(80, rel=1e-2)  # the source rounds 79.6


# -- never a silent zero --------------------------------------------------------------------
@torch.library.custom_op("nnperf_tests::mystery", mutates_args=())
def mystery(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * w


@mystery.register_fake
def _mystery_fake(x, w):
    return torch.empty_like(x)


class UsesMystery(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.scale = nn.Parameter(torch.ones(8))

    def forward(self, x):
        y = self.fc(x)
        y = torch.ops.nnperf_tests.mystery(y, self.scale)
        return torch.ops.nnperf_tests.mystery(y, self.scale)


def test_op_without_formula_is_reported_with_count_and_bytes():
    batch = 4
    a = analyze(UsesMystery(), inputs=(torch.randn(batch, 8),), train=False)
    cov = a.coverage
    entry = next(u for u in cov["uncovered"] if u["op"] == "nnperf_tests.mystery")
    assert entry["count"] == 2
    # each call reads (4, 8) activations and the 8-element weight, writes (4, 8): fp32
    assert entry["bytes"] == 2 * 4 * (batch * 8 + 8 + batch * 8)
    assert cov["op_share"] < 1
    assert cov["byte_share"] < 1
    assert cov["modeled"] == cov["ops"] - sum(u["count"] for u in cov["uncovered"])
    ops = [o for o in a.ops if o.op == "nnperf_tests.mystery"]
    assert all(not o.covered and o.category == "uncovered" for o in ops)
    assert all(o.bytes_weights == 4 * 8 for o in ops)  # the parameter it reads is weight traffic
    assert a.to_json()["coverage"]["uncovered"] == cov["uncovered"]


def test_fully_covered_model_reports_full_share():
    a = analyze(nn.Linear(8, 4, bias=False), inputs=(torch.randn(2, 8),), train=False)
    assert [o.op for o in a.ops] == ["aten.mm"]
    assert a.coverage["op_share"] == 1 and a.coverage["uncovered"] == []
