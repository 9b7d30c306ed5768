"""Latency-bound per-thread loops: resident blocks, waves and round trips, by hand."""

from __future__ import annotations

import pytest

from nnperf.hardware import default_profile, load_gpu
from nnperf.hardware.architecture import resident_limits
from nnperf.kernels.native_loops import LoopKernel, loop_kernel_time, resident_blocks, waves


def test_resident_limits_follow_the_cuda_programming_guide():
    assert resident_limits("9.0") == (2048, 32)  # Hopper
    assert resident_limits("8.0") == (2048, 32)  # A100
    assert resident_limits("8.6") == (1536, 16)  # GA10x
    assert resident_limits("8.9") == (1536, 24)  # Ada
    assert resident_limits("7.5") == (1024, 16)  # Turing
    assert resident_limits("gfx942") == (2048, 32)  # not an NVIDIA capability: the default


def test_resident_blocks_by_hand():
    h200, t4, rtx4090 = load_gpu("h200-sxm"), load_gpu("t4"), load_gpu("rtx-4090")
    assert resident_blocks(512, h200) == 4 * 132  # 2048 / 512 per SM
    assert resident_blocks(512, t4) == 2 * 40  # 1024 / 512
    assert resident_blocks(512, rtx4090) == 3 * 128  # 1536 / 512
    assert resident_blocks(32, h200) == 32 * 132  # the block limit binds: 2048 / 32 = 64 > 32
    assert resident_blocks(4096, h200) == 132  # at least one per SM


def test_a_loop_takes_waves_times_iterations_times_a_round_trip():
    h200 = load_gpu("h200-sxm")
    profile = default_profile(h200).replace(loop_iteration_cycles=600.0)
    # one block per channel of a 64-channel batch norm: 64 blocks, one wave
    k = LoopKernel("stats", blocks=64, threads=512, iterations=1600, bytes=0.0)
    assert waves(k, h200) == 1
    assert loop_kernel_time(k, h200, profile) == pytest.approx(1600 * 600 / 1980e6)
    # 4096 blocks of 512 threads on 528 resident: 8 waves
    k = LoopKernel("transform", blocks=4096, threads=512, iterations=25, bytes=0.0)
    assert waves(k, h200) == 8
    assert loop_kernel_time(k, h200, profile) == pytest.approx(8 * 25 * 600 / 1980e6)


def test_bandwidth_is_the_floor():
    h200 = load_gpu("h200-sxm")
    profile = default_profile(h200)
    k = LoopKernel("copy-like", blocks=1, threads=512, iterations=1, bytes=4e9)
    assert loop_kernel_time(k, h200, profile) == pytest.approx(profile.memory_time(h200.memory_bandwidth, 4e9))


def test_a_bad_launch_is_refused():
    with pytest.raises(ValueError):
        LoopKernel("none", blocks=0, threads=512, iterations=1, bytes=0.0)
