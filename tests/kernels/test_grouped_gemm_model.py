"""The grouped-GEMM time model (``kernels.grouped_gemm``): which path PyTorch takes, one launch
with per-group tile quantization and waves over every group's tiles (CUTLASS), or one GEMM per
group after a host sync (the fallback)."""

from __future__ import annotations

import math

import pytest

from nnperf.hardware import default_profile, load_gpu
from nnperf.kernels.engines import TRANSFORMER_ENGINE
from nnperf.kernels.gemm import estimate_gemm, tile_quantization
from nnperf.kernels.grouped_gemm import (
    CUTLASS,
    FALLBACK,
    TE_STREAMS,
    estimate_grouped_gemm,
    even_split,
    grouped_mm_path,
    sizes_from_offsets,
)

H100, A100, B200 = load_gpu("h100"), load_gpu("a100"), load_gpu("b200")


@pytest.mark.parametrize("dtype, gpu, path", [
    ("bf16", H100, CUTLASS), ("bf16", B200, CUTLASS),  # sm_90 / sm_100
    ("bf16", A100, FALLBACK),  # _scaled_mm_allowed_device(sm90_only, sm100_only) refuses sm_80
    ("fp16", H100, FALLBACK), ("fp32", H100, FALLBACK),  # the fast path is bf16 only
])
def test_path_follows_grouped_blas(dtype, gpu, path):
    assert grouped_mm_path(dtype, gpu) == path
    # Transformer Engine's GroupedLinear takes its own path whatever the dtype or architecture
    assert grouped_mm_path(dtype, gpu, TRANSFORMER_ENGINE) == TE_STREAMS


def _only(tile):
    return default_profile(H100).replace(tile_relative_efficiency={tile: 1.0}, ctas_per_sm={tile: 1})


def test_one_launch_pays_each_groups_tile_padding_and_the_waves_of_all_tiles():
    """8 experts of 100 rows, N = K = 4096, bf16, one 128x128 tile: each group pads its rows to
    128 (100/128 used) and the 8 x 1 x 32 = 256 tiles run in 2 waves on 132 SMs."""
    profile = _only("128x128")
    groups = [(100, 4096, 4096)] * 8
    est = estimate_grouped_gemm(groups, dtype="bf16", gpu=H100, profile=profile, min_bytes=1e6)
    assert est.kernels == 1 and not est.host_sync
    assert est.ctas == 8 * 32 and est.waves == 2
    assert est.tile_efficiency == pytest.approx(100 / 128)
    assert est.wave_efficiency == pytest.approx(256 / 264)
    one = estimate_gemm(800, 4096, 4096, dtype="bf16", gpu=H100, profile=profile)
    usable = one.peak_flops * one.math_fraction * one.alignment_factor
    flops = 2 * 800 * 4096 * 4096
    assert est.model_compute_s == pytest.approx(flops / (usable * (100 / 128) * (256 / 264)))
    assert est.time_s == pytest.approx(max(est.model_compute_s, est.model_memory_s) + profile.kernel_overhead_s)
    # Padding costs time when it adds a wave: 12 experts of 129 rows need 2 tile rows each,
    # 12 x 2 x 8 = 192 tiles of N = 1024 (2 waves); the same 1548 rows as one GEMM need 13 tile
    # rows, 104 tiles (1 wave)
    split = estimate_grouped_gemm([(129, 1024, 4096)] * 12, dtype="bf16", gpu=H100, profile=profile,
                                  min_bytes=1e6)
    merged = estimate_grouped_gemm([(1548, 1024, 4096)], dtype="bf16", gpu=H100, profile=profile,
                                   min_bytes=1e6)
    assert (split.ctas, split.waves, merged.ctas, merged.waves) == (192, 2, 104, 1)
    assert merged.tile_efficiency == pytest.approx(tile_quantization(1548, 1024, (128, 128))[1])
    assert split.model_compute_s == pytest.approx(2 * merged.model_compute_s)


def test_transformer_engine_runs_four_groups_at_a_time():
    """8 experts of 256 rows, N = 1024, K = 4096, one 128x128 tile: each GEMM is 2 x 8 = 16
    tiles. TE's four streams hold four GEMMs at once, 64 tiles on 132 SMs (one wave at 64/132),
    twice; CUTLASS's one grid holds all 128 tiles in one wave (128/132): the same FLOPs take
    132/64 / (132/128) = 2x the compute time, in 8 kernels and two rounds of overhead."""
    profile = _only("128x128")
    groups = [(256, 1024, 4096)] * 8
    te = estimate_grouped_gemm(groups, dtype="bf16", gpu=H100, profile=profile, min_bytes=1e6,
                               engine=TRANSFORMER_ENGINE)
    one = estimate_grouped_gemm(groups, dtype="bf16", gpu=H100, profile=profile, min_bytes=1e6)
    assert (te.path, te.kernels, te.ctas, te.waves) == (TE_STREAMS, 8, 128, 2)
    assert (one.path, one.kernels, one.ctas, one.waves) == (CUTLASS, 1, 128, 1)
    assert te.wave_efficiency == pytest.approx(128 / 264)
    ref = estimate_gemm(1024, 1024, 4096, dtype="bf16", gpu=H100, profile=profile)  # a round's rows
    usable = ref.peak_flops * ref.math_fraction * ref.alignment_factor
    round_flops = 4 * 2 * 256 * 1024 * 4096
    assert te.model_compute_s == pytest.approx(2 * round_flops / (usable * 64 / 132))
    assert te.model_compute_s == pytest.approx(2 * one.model_compute_s)
    memory = profile.memory_time(H100.memory_bandwidth, 1e6)
    assert te.time_s == pytest.approx(2 * (max(te.model_compute_s / 2, memory / 2) + profile.kernel_overhead_s))
    # a fifth group is a round of its own: 16 tiles in one wave at 16/132, at the rate of its
    # 256 rows alone
    five = estimate_grouped_gemm(groups[:5], dtype="bf16", gpu=H100, profile=profile, min_bytes=1e6,
                                 engine=TRANSFORMER_ENGINE)
    last = estimate_gemm(256, 1024, 4096, dtype="bf16", gpu=H100, profile=profile)
    last_usable = last.peak_flops * last.math_fraction * last.alignment_factor
    assert (five.kernels, five.ctas, five.waves) == (5, 80, 2)
    assert five.model_compute_s == pytest.approx(round_flops / (usable * 64 / 132)
                                                 + round_flops / 4 / (last_usable * 16 / 132))
    # four groups or fewer are one round: CUTLASS's grid, in as many kernels as groups
    few = estimate_grouped_gemm(groups[:4], dtype="bf16", gpu=H100, profile=profile, min_bytes=1e6,
                                engine=TRANSFORMER_ENGINE)
    grid = estimate_grouped_gemm(groups[:4], dtype="bf16", gpu=H100, profile=profile, min_bytes=1e6)
    assert few.kernels == 4 and few.time_s == pytest.approx(grid.time_s)


def test_fallback_is_one_gemm_per_group_after_a_host_sync():
    profile = default_profile(A100)
    groups = [(64, 1024, 512), (32, 1024, 512), (0, 1024, 512), (96, 1024, 512)]
    est = estimate_grouped_gemm(groups, dtype="bf16", gpu=A100, profile=profile, min_bytes=1e6)
    assert est.path == FALLBACK and est.host_sync and est.kernels == 3  # the empty group runs nothing
    each = [estimate_gemm(m, n, k, dtype="bf16", gpu=A100, profile=profile) for m, n, k in groups if m]
    assert est.time_s == pytest.approx(sum(e.time_s for e in each))
    batched = estimate_grouped_gemm([(64, 256, 128)] * 4, dtype="bf16", gpu=A100, profile=profile,
                                    min_bytes=1e6, batched=True)
    assert batched.kernels == 1 and not batched.host_sync  # 3-D x 3-D: one bmm
    assert batched.time_s == pytest.approx(
        estimate_gemm(64, 256, 128, batch=4, dtype="bf16", gpu=A100, profile=profile).time_s)


def test_group_sizes():
    assert even_split(10, 4) == [3, 3, 2, 2]
    assert sizes_from_offsets([4, 4, 9, 12], 10) == [4, 0, 5, 1]  # clipped to the rows there are
    assert math.fsum(even_split(128, 8)) == 128
