"""The GEMM time model against hand computations from NVIDIA's "Matrix Multiplication Background".

Every expected value is computed here from datasheet numbers and the guide's formulas, never
copied from the model's output.
"""

from __future__ import annotations

import itertools
import math

import pytest

from nnperf.errors import UsageError
from nnperf.hardware import default_profile, load_gpu
from nnperf.kernels.gemm import estimate_gemm, tile_quantization, wave_quantization

H100 = load_gpu("h100")  # 132 SMs, bf16 989.4 TFLOP/s dense, 3350 GB/s
A100 = load_gpu("a100")  # 108 SMs, tf32 156, fp32 19.5 TFLOP/s, 2039 GB/s
V100 = load_gpu("v100")  # 80 SMs, fp32 15.7 TFLOP/s on CUDA cores


def only_tile(gpu, tile: str, **changes):
    """A profile whose single candidate tile is ``tile`` (so the hand computation is exact)."""
    return default_profile(gpu).replace(tile_relative_efficiency={tile: 1.0}, **changes)


def test_misaligned_k_is_slower_and_flagged():
    aligned = estimate_gemm(4096, 4096, 4096, dtype="bf16", gpu=H100)
    odd = estimate_gemm(4096, 4096, 4095, dtype="bf16", gpu=H100)
    assert aligned.aligned and not odd.aligned
    assert odd.time_s > aligned.time_s
    assert "K=4095 is not a multiple of 8 bf16 elements (16 bytes)" in odd.alignment_note


def test_128_byte_preference_on_a100_only():
    # 4104 = 8 * 513: a multiple of 16 bytes of bf16 but not of 128 bytes (64 elements).
    a100 = estimate_gemm(4096, 4104, 4096, dtype="bf16", gpu=A100)
    assert a100.aligned and a100.alignment_factor < 1 and "128 bytes" in a100.alignment_note
    v100 = estimate_gemm(4096, 4104, 4096, dtype="fp16", gpu=V100)
    assert v100.aligned and v100.alignment_factor == 1


def expected_waves(size: int, tile=(256, 128), sms=132) -> int:
    return math.ceil(math.ceil(size / tile[0]) * math.ceil(size / tile[1]) / sms)


def test_wave_quantization_saw_tooth_on_h100():
    profile = only_tile(H100, "256x128")
    sizes = list(range(2048, 8192 + 1, 128))
    tflops = {}
    for s in sizes:
        e = estimate_gemm(s, s, s, dtype="bf16", gpu=H100, profile=profile)
        assert e.split_k == 1 and e.waves == expected_waves(s)
        tflops[s] = e.achieved_flops / 1e12
    crossings = [
        s for prev, s in itertools.pairwise(sizes) if expected_waves(s) > expected_waves(prev)
    ]
    assert 2176 in crossings and len(crossings) >= 10  # 9*17 = 153 tiles > 132 SMs
    for s in crossings:
        assert tflops[s] < tflops[s - 128], f"no drop when {s} crosses a wave boundary"


def test_saw_tooth_with_all_candidate_tiles():
    # 2048: 256x128 gives 8*16 = 128 CTAs, one wave at 128/132 = 97%. 2176: 256x128 gives
    # 9*17 = 153 CTAs -> 2 waves at 58%, and no other tile recovers 97%.
    e2048 = estimate_gemm(2048, 2048, 2048, gpu=H100)
    e2176 = estimate_gemm(2176, 2176, 2176, gpu=H100)
    assert e2048.tile in {(256, 128), (128, 256)} and e2048.waves == 1
    assert e2176.achieved_flops < e2048.achieved_flops


@pytest.mark.parametrize(
    "gpu,shape,batch,tile,exp_tile_eff,exp_ctas,exp_waves",
    [
        (H100, (2176, 2176, 2176), 1, "256x128", 2176 / 2304, 9 * 17, 2),
        (A100, (1000, 3000, 512), 1, "128x128", 1000 * 3000 / (1024 * 3072), 8 * 24, 2),
        (H100, (512, 512, 4096), 10, "128x128", 1.0, 16 * 10, 2),
        (H100, (100, 200, 4096), 1, "64x64", 100 * 200 / (128 * 256), 2 * 4, 1),
    ],
)
def test_tile_and_wave_efficiency_match_the_guide(
    gpu, shape, batch, tile, exp_tile_eff, exp_ctas, exp_waves
):
    profile = only_tile(gpu, tile, split_k_max=1)
    e = estimate_gemm(*shape, batch=batch, dtype="bf16", gpu=gpu, profile=profile)
    assert e.tile_efficiency == pytest.approx(exp_tile_eff)
    assert e.ctas == exp_ctas and e.waves == exp_waves
    assert e.wave_efficiency == pytest.approx(exp_ctas / (exp_waves * gpu.sm_count))


def test_quantization_helpers():
    assert tile_quantization(2176, 2176, (256, 128)) == (153, pytest.approx(2176 / 2304))
    assert wave_quantization(153, 132) == (2, pytest.approx(153 / 264))
    assert wave_quantization(264, 132, ctas_per_sm=2) == (1, 1.0)


def test_fp32_runs_on_cuda_cores_on_v100():
    # 8192^3 with 256x128 tiles: 32*64 = 2048 CTAs on 80 SMs -> 26 waves, 2048/2080 efficiency.
    e = estimate_gemm(8192, 8192, 8192, dtype="fp32", gpu=V100)
    frac = default_profile(V100).cuda_core_fraction
    assert e.math_unit == "cuda" and e.peak_flops == 15.7e12
    assert e.achieved_flops == pytest.approx(15.7e12 * frac * 2048 / 2080, rel=0.01)


def test_fp32_on_a100_with_and_without_tf32():
    # 2048 CTAs on 108 SMs -> 19 waves, 2048/2052 efficiency.
    p = default_profile(A100)
    tf32 = estimate_gemm(8192, 8192, 8192, dtype="fp32", gpu=A100, tf32=True)
    assert tf32.math_unit == "tensor" and tf32.peak_flops == 156e12
    assert tf32.achieved_flops == pytest.approx(
        156e12 * p.gemm_peak_fraction * 2048 / 2052, rel=0.01
    )
    plain = estimate_gemm(8192, 8192, 8192, dtype="fp32", gpu=A100)
    assert plain.math_unit == "cuda" and plain.peak_flops == 19.5e12
    assert plain.achieved_flops == pytest.approx(
        19.5e12 * p.cuda_core_fraction * 2048 / 2052, rel=0.01
    )


def test_gemv_is_memory_bound_and_respects_the_roofline():
    m, n, k = 1, 8192, 8192
    min_bytes = 2 * (m * k + k * n + m * n)
    e = estimate_gemm(m, n, k, dtype="bf16", gpu=H100)
    assert e.min_bytes == min_bytes
    assert e.intensity == pytest.approx(2 * m * n * k / min_bytes) and e.intensity < e.ridge
    assert e.bound == "memory"
    assert e.time_s >= min_bytes / 3350e9


@pytest.mark.parametrize(
    "shape,dtype,gpu",
    [
        ((4096, 4096, 4096), "bf16", H100),
        ((1, 4096, 4096), "bf16", H100),
        ((128, 128, 65536), "bf16", H100),
        ((8192, 8192, 8192), "fp32", V100),
        ((33, 77, 5), "fp16", A100),
        ((4096, 4096, 4096), "int8", H100),
    ],
)
def test_never_faster_than_the_roofline(shape, dtype, gpu):
    e = estimate_gemm(*shape, dtype=dtype, gpu=gpu)
    flops = 2 * shape[0] * shape[1] * shape[2]
    peak = gpu.matmul_peak(dtype).flops
    assert e.time_s >= max(flops / peak, e.min_bytes / gpu.memory_bandwidth)
    assert e.time_s >= default_profile(gpu).kernel_overhead_s


def test_split_k_for_small_output_and_long_k():
    # 128x128 output: at most 4 CTAs (64x64 tiles) for 132 SMs; K=65536 can be split.
    e = estimate_gemm(128, 128, 65536, dtype="bf16", gpu=H100)
    no_split = estimate_gemm(
        128,
        128,
        65536,
        dtype="bf16",
        gpu=H100,
        profile=default_profile(H100).replace(split_k_max=1),
    )
    assert e.split_k > 1 and e.ctas <= 132 and e.reduction_s > 0
    assert e.time_s < no_split.time_s


def test_int8_output_is_int32_and_measured_curve_replaces_the_fraction():
    e = estimate_gemm(4096, 4096, 4096, dtype="int8", gpu=H100)
    assert e.min_bytes == 2 * 4096 * 4096 + 4 * 4096 * 4096
    curve = default_profile(H100).replace(gemm_efficiency={"bf16": ((1e6, 0.5), (1e15, 0.5))})
    assert estimate_gemm(4096, 4096, 4096, gpu=H100, profile=curve).math_fraction == 0.5


def test_bad_input():
    with pytest.raises(UsageError, match="K=0"):
        estimate_gemm(1, 1, 0, gpu=H100)
    with pytest.raises(UsageError, match="unknown dtype"):
        estimate_gemm(1, 1, 1, dtype="fp4", gpu=H100)
    with pytest.raises(UsageError, match=r"no .*bf16 units"):
        estimate_gemm(64, 64, 64, dtype="bf16", gpu=V100)
    assert "no bf16 units" in estimate_gemm(64, 64, 64, dtype="bf16", gpu=V100, fallback=True).note


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize(("m", "n"), [(1, 4096), (4096, 1)])
def test_matrix_vector_product_is_a_memory_bound_gemv(dtype, m, n):
    # A batch-1 linear layer: cuBLAS runs a GEMV kernel, one pass over the 4096x4096 weight.
    # Hand count: bytes = weight + vector in + vector out; time >= bytes / datasheet bandwidth.
    gpu = load_gpu("h100")
    size = 2 if dtype == "bf16" else 4
    weight_bytes = 4096 * 4096 * size
    e = estimate_gemm(m, n, 4096, dtype=dtype, gpu=gpu)
    assert e.tile == (0, 0) and e.to_dict()["tile"] == "GEMV" and e.math_unit == "cuda"
    assert e.bound == "memory"
    floor = (weight_bytes + 2 * 4096 * size) / gpu.memory_bandwidth
    assert floor <= e.time_s <= 2 * floor + 10e-6  # within the achievable bandwidth and overhead
    # a tensor-core tile for one row would pad it to 64: the GEMV is the faster choice
    assert e.model_compute_s < e.model_memory_s


def test_half_rate_tensor_math_reaches_the_low_rate_fraction():
    """RTX 4090 fp16 with fp32 accumulate: 165.2 TFLOP/s / (128 SMs x 2.52 GHz) = 512 FLOP per
    clock per SM, the GeForce half rate; an H100's bf16 is 989.4 / (132 x 1.83) = 4096."""
    rtx, h100 = load_gpu("rtx-4090"), load_gpu("h100")
    assert rtx.flops_per_clock_per_sm(rtx.peak("fp16")) == pytest.approx(512, rel=0.01)
    assert h100.flops_per_clock_per_sm(h100.peak("bf16")) == pytest.approx(4096, rel=0.01)
    p_rtx, p_h100 = default_profile(rtx), default_profile(h100)
    assert estimate_gemm(8192, 8192, 8192, dtype="fp16", gpu=rtx).math_fraction == p_rtx.low_rate_tensor_fraction
    assert estimate_gemm(8192, 8192, 8192, dtype="bf16", gpu=h100).math_fraction == p_h100.gemm_peak_fraction
    assert p_rtx.low_rate_tensor_fraction > p_h100.gemm_peak_fraction
