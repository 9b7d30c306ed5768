"""Each pass of a tensor-core convolution runs at its class's efficiency relative to the GEMM
model (profile ``conv_efficiency``): stride-1 convolutions with >= 14x14 outputs in every
pass, the others per pass."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nnperf.analysis import analyze
from nnperf.hardware import default_profile, load_gpu
from nnperf.kernels.gemm import estimate_gemm
from nnperf.passes.costs.matmul import conv_geometry
from nnperf.prediction import predict_analysis

GPU = "a100-80gb-sxm"


class Net(nn.Module):
    """A stride-1 3x3 on 28x28, a strided 3x3 (28x28 -> 14x14), a stride-1 3x3 on 7x7 input
    (the second and third get both gradients: their inputs need one)."""

    def __init__(self) -> None:
        super().__init__()
        self.large = nn.Conv2d(64, 64, 3, padding=1, bias=False)
        self.strided = nn.Conv2d(64, 128, 3, stride=2, padding=1, bias=False)
        self.pool = nn.AdaptiveAvgPool2d(7)
        self.small = nn.Conv2d(128, 128, 3, padding=1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.small(self.pool(self.strided(self.large(x))))


@pytest.fixture(scope="module")
def ops():
    analysis = analyze(Net(), torch.randn(32, 64, 28, 28), train=True, optimizer="none", amp="fp16",
                       channels_last=True)
    return {(t.module, t.phase): t for t in predict_analysis(analysis, load_gpu(GPU)).step.ops
            if t.category == "conv"}


def _gemm(m: int, n: int, k: int) -> float:
    gpu = load_gpu(GPU)
    return estimate_gemm(m, n, k, dtype="fp16", gpu=gpu, profile=default_profile(gpu)).model_compute_s


def test_geometry_of_the_events(ops):
    assert conv_geometry(ops[("strided", "forward")].count.event) == (2, 14 * 14)
    assert conv_geometry(ops[("strided", "backward")].count.event) == (2, 14 * 14)  # its output gradient
    assert conv_geometry(ops[("small", "backward")].count.event) == (1, 7 * 7)


def test_each_pass_at_its_class(ops):
    eff = default_profile(load_gpu(GPU)).conv_efficiency
    # stride 1, 28x28 output: one value for every pass; its input needs no gradient
    m = 32 * 28 * 28
    assert ops[("large", "forward")].model_compute_s == pytest.approx(_gemm(m, 64, 576) / eff["stride1_large"])
    assert ops[("large", "backward")].model_compute_s == pytest.approx(_gemm(64, 576, m) / eff["stride1_large"])
    # stride 2, 14x14 output: forward (NPQ, K, CRS), data gradient (NPQ, CRS, K), weight (K, CRS, NPQ)
    m = 32 * 14 * 14
    assert ops[("strided", "forward")].model_compute_s == pytest.approx(_gemm(m, 128, 576) / eff["other_forward"])
    assert ops[("strided", "backward")].model_compute_s == pytest.approx(
        _gemm(m, 576, 128) / eff["other_grad_input"] + _gemm(128, 576, m) / eff["other_grad_weight"])
    # stride 1 on a 7x7 output: the small class
    m = 32 * 7 * 7
    assert ops[("small", "forward")].model_compute_s == pytest.approx(_gemm(m, 128, 1152) / eff["other_forward"])
    assert ops[("small", "backward")].model_compute_s == pytest.approx(
        _gemm(m, 1152, 128) / eff["other_grad_input"] + _gemm(128, 1152, m) / eff["other_grad_weight"])
    assert eff["other_grad_input"] < eff["other_forward"] < eff["stride1_large"]  # what DeepBench shows


def test_the_scale_multiplies_every_class():
    gpu = load_gpu(GPU)
    analysis = analyze(Net(), torch.randn(8, 64, 28, 28), train=True, optimizer="none", amp="fp16")
    base = default_profile(gpu)
    slow = base.replace(conv_efficiency_scale=0.5)

    def compute(profile):
        return {(t.module, t.phase): t.model_compute_s
                for t in predict_analysis(analysis, gpu, profile).step.ops if t.category == "conv"}

    before, after = compute(base), compute(slow)
    assert set(before) == set(after) and len(before) == 6
    for key, value in before.items():
        assert after[key] == pytest.approx(2 * value), key
