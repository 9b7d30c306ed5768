"""NCHW max pooling as DilatedMaxPool2d.cu runs it: window taps and covering outputs by hand."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nnperf.analysis import analyze
from nnperf.hardware import default_profile, load_gpu
from nnperf.kernels import max_pool
from nnperf.kernels.native_loops import loop_kernel_time
from nnperf.passes.kernel_calls import max_pool_call
from nnperf.prediction import predict_analysis


def test_window_taps_clip_at_the_borders():
    # ResNet's stem pool: k=3, s=2, p=1 on 112 -> 56. Output 0 starts at -1: rows 0..1 (2 taps);
    # every other output has its 3 rows inside.
    taps = max_pool.window_taps(112, 56, 3, 2, 1, 1)
    assert taps[0] == 2 and set(taps[1:]) == {3}


def test_covering_outputs_by_hand():
    # k=3, s=2, p=1: input row i is in the windows of outputs (i+1-3)//2+1 .. (i+1)//2.
    # Row 0: output 0 only; row 1: outputs 0 and 1; row 2: output 1; row 3: outputs 1 and 2.
    assert max_pool.covering(112, 56, 3, 2, 1, 1)[:4] == [1, 2, 1, 2]
    assert max_pool.covering(112, 56, 3, 2, 1, 1)[-1] == 1  # row 111: output 55


class Stem(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.pool = nn.MaxPool2d(3, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.conv(x))


@pytest.fixture(scope="module")
def resnet_stem():
    return analyze(Stem(), torch.randn(64, 3, 224, 224), train=True, optimizer="none", amp="bf16")


def test_the_calls_and_loops_of_resnets_stem_pool(resnet_stem):
    fwd_event = next(e for e in resnet_stem.trace.events if e.name == max_pool.FORWARD)
    bwd_event = next(e for e in resnet_stem.trace.events if e.name == max_pool.BACKWARD)
    fwd, bwd = max_pool_call(fwd_event), max_pool_call(bwd_event)
    assert (fwd.batch, fwd.channels, fwd.in_hw, fwd.out_hw) == (64, 64, (112, 112), (56, 56))
    assert fwd.kernel == (3, 3) and fwd.stride == (2, 2) and fwd.padding == (1, 1) and bwd.backward
    # mean taps per output: rows (2 + 55 x 3) / 56 squared
    assert fwd.forward_taps() == pytest.approx(((2 + 55 * 3) / 56) ** 2)
    # mean outputs covering an input: odd rows 2, even rows 1, but row 111 is clipped to 1
    # (no output 56): 55 twos and 57 ones per dimension, squared
    assert bwd.backward_visits() == pytest.approx(((57 * 1 + 55 * 2) / 112) ** 2)
    forward = max_pool.nchw_loop(fwd)
    assert (forward.blocks, forward.threads, forward.iterations) == (64 * 64 * 56 * 56 // 256, 256, 9)
    backward = max_pool.nchw_loop(bwd)
    # grid (ceil(12544 / 256), N, C) of 256 threads; ceil(2.25) = 3 outputs visited
    assert (backward.blocks, backward.threads, backward.iterations) == (49 * 64 * 64, 256, 3)


def test_the_backward_adds_its_zero_fill(resnet_stem):
    gpu = load_gpu("h200-sxm")
    profile = default_profile(gpu)
    ops = {t.op: t for t in predict_analysis(resnet_stem, gpu, profile).step.ops}
    bwd = ops[max_pool.BACKWARD]
    loop = max_pool.nchw_loop(max_pool_call(bwd.count.event))
    fill = profile.memory_time(gpu.memory_bandwidth, 64 * 64 * 112 * 112 * 2)
    assert bwd.kernels == 2
    assert bwd.kernel_s == pytest.approx(loop_kernel_time(loop, gpu, profile) + fill + 2 * profile.kernel_overhead_s)
