"""How long one GEMM takes on a GPU, the way NVIDIA's performance guide explains it.

Follows "Matrix Multiplication Background" (NVIDIA Deep Learning Performance Guide): the
output is cut into CTA tiles scheduled on the SMs in waves; partial tiles waste work (tile
quantization) and a partly filled last wave wastes time (wave quantization); tensor cores need
16-byte aligned dimensions; a GEMM is compute- or memory-bound depending on its arithmetic
intensity versus the GPU's ridge point. Like a heuristic library (cuBLAS), every candidate tile
(and split-K factor, for GEMMs that fill less than one wave) is evaluated and the fastest kept.

The result is never faster than the roofline, max(flops / peak, min_bytes / bandwidth), plus
the kernel overhead. Every efficiency constant comes from the ``DeviceProfile``.
FLOP counts follow the convention 1 multiply-accumulate = 2 FLOPs.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from nnperf.errors import UsageError
from nnperf.hardware import DTYPE_BYTES, GPU, DeviceProfile, default_profile, normalize_dtype
from nnperf.hardware.catalog import PeakRate


@dataclass(frozen=True)
class GemmEstimate:
    """One GEMM's predicted time and every quantity the guide uses to explain it."""

    m: int
    n: int
    k: int
    batch: int
    dtype: str
    gpu: str
    flops: float  # 2 * M * N * K * batch
    min_bytes: float  # each operand read once, the output written once
    intensity: float  # FLOP per byte
    ridge: float  # datasheet peak / datasheet bandwidth, FLOP per byte
    math_unit: str  # "tensor" | "cuda"
    rate_dtype: str  # the peak used, e.g. "tf32" for an fp32 GEMM with TF32 on
    peak_flops: float  # of that unit, FLOP/s
    math_fraction: float  # achievable fraction of that peak (profile)
    tile: tuple[int, int]
    tile_relative_efficiency: float  # of the chosen tile (profile)
    ctas: int
    waves: int
    tile_efficiency: float
    wave_efficiency: float
    split_k: int
    aligned: bool
    alignment_factor: float
    alignment_note: str
    compute_s: float  # flops / peak: the roofline's compute time
    memory_s: float  # min_bytes / datasheet bandwidth: the roofline's memory time
    model_compute_s: float  # with tile, wave, alignment and achievable-fraction losses
    model_memory_s: float  # min_bytes at the achievable bandwidth for that size
    reduction_s: float  # split-K partial-sum traffic and its kernel
    overhead_s: float  # kernel overhead(s)
    time_s: float  # predicted
    bound: str  # "compute" | "memory": which model term dominates the prediction
    note: str = ""  # e.g. a dtype fallback

    @property
    def achieved_flops(self) -> float:
        """FLOP/s the prediction implies (useful FLOPs only)."""
        return self.flops / self.time_s

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["tile"] = tile_text(self.tile)
        out["achieved_flops"] = self.achieved_flops
        return out


@dataclass(frozen=True)
class _Candidate:
    tile: tuple[int, int]
    split_k: int
    ctas: int
    waves: int
    tile_efficiency: float
    wave_efficiency: float
    compute_s: float
    reduction_s: float


def tile_quantization(m: int, n: int, tile: tuple[int, int]) -> tuple[int, float]:
    """(number of output tiles, tile efficiency M*N / (ceil(M/Tm)*Tm * ceil(N/Tn)*Tn))."""
    tm, tn = tile
    tiles_m, tiles_n = math.ceil(m / tm), math.ceil(n / tn)
    return tiles_m * tiles_n, (m * n) / (tiles_m * tm * tiles_n * tn)


def wave_quantization(ctas: int, sm_count: int, ctas_per_sm: int = 1) -> tuple[int, float]:
    """(waves = ceil(CTAs / (SMs * CTAs_per_SM)), wave efficiency CTAs / (waves * slots))."""
    slots = sm_count * ctas_per_sm
    waves = math.ceil(ctas / slots)
    return waves, ctas / (waves * slots)


def _alignment(
    dims: dict[str, int], dtype: str, unit: str, gpu: GPU, profile: DeviceProfile
) -> tuple[bool, float, str]:
    """Whether the tensor-core alignment rules hold, the efficiency factor and why."""
    if unit != "tensor":
        return True, 1.0, "CUDA-core math: no tensor-core alignment requirement"
    size = DTYPE_BYTES[dtype]
    per16 = max(1, 16 // size)
    bad = [f"{name}={v}" for name, v in dims.items() if v % per16]
    if bad:
        verb = "is not a multiple" if len(bad) == 1 else "are not multiples"
        note = f"{', '.join(bad)} {verb} of {per16} {dtype} elements (16 bytes)"
        # a dtype's own measured penalty where the profile has one (``16B.bf16``), else the class's
        penalty = profile.alignment_penalty.get(f"16B.{dtype}", profile.alignment_penalty.get("16B", 1.0))
        return False, penalty, note
    if gpu.arch.prefers_128_byte_alignment:
        per128 = 128 // size
        loose = [f"{name}={v}" for name, v in dims.items() if v % per128]
        if loose:
            verb = "is not a multiple" if len(loose) == 1 else "are not multiples"
            note = (
                f"16-byte aligned, but {', '.join(loose)} {verb} of {per128} {dtype} elements "
                f"(128 bytes), which {gpu.architecture} prefers"
            )
            return True, profile.alignment_penalty.get("128B", 1.0), note
    return True, 1.0, f"M, N, K are multiples of 16 bytes ({per16} {dtype} elements)"


def _candidates(
    m: int,
    n: int,
    k: int,
    batch: int,
    flops: float,
    rate_flops: float,
    gpu: GPU,
    profile: DeviceProfile,
) -> list[_Candidate]:
    """Every tile (and split-K factor when one wave is not filled) with its compute time."""
    out = []
    for tile in profile.tiles():
        tiles, tile_eff = tile_quantization(m, n, tile)
        per_sm = profile.tile_ctas_per_sm(tile)
        slots = gpu.sm_count * per_sm
        rel = profile.tile_efficiency(tile)
        splits = [1]
        if tiles * batch < slots:
            splits += [
                s
                for s in range(2, profile.split_k_max + 1)
                if math.ceil(k / s) >= profile.split_k_min_k
            ]
        for s in splits:
            ctas = tiles * batch * s
            waves, wave_eff = wave_quantization(ctas, gpu.sm_count, per_sm)
            k_eff = k / (s * math.ceil(k / s))
            compute_s = flops / (rate_flops * rel * tile_eff * wave_eff * k_eff)
            reduction_s = 0.0
            if s > 1:  # fp32 partial tiles written, then read back by a reduction kernel
                partial_bytes = 2 * s * m * n * batch * 4
                reduction_s = (
                    profile.memory_time(gpu.memory_bandwidth, partial_bytes)
                    + profile.kernel_overhead_s
                )
            out.append(_Candidate(tile, s, ctas, waves, tile_eff, wave_eff, compute_s, reduction_s))
    return out


#: The tile ``GemmEstimate.tile`` reports for a GEMV kernel, which has no output tiles.
GEMV_TILE = (0, 0)


def tile_text(tile: tuple[int, int]) -> str:
    """How tables name a tile: "128x256", or "GEMV" for the matrix-vector kernel."""
    return "GEMV" if tile == GEMV_TILE else f"{tile[0]}x{tile[1]}"


def _gemv_candidate(m: int, n: int, flops: float, cuda: PeakRate | None, profile: DeviceProfile) -> _Candidate | None:
    """A matrix-vector product (M or N is 1) as cuBLAS runs it: a GEMV kernel on CUDA cores
    (``gemv2T_kernel`` in profiles of batch-1 linear layers), one pass over the matrix with no
    output tiles to pad; tensor-core tiles would waste 15/16 or more of their rows on it.
    None for other shapes, or a dtype the CUDA cores do not compute (``cuda`` None)."""
    if min(m, n) != 1 or cuda is None:
        return None
    # no CTA tiles and no waves to quantize: reported as 0 CTAs in 0 waves
    return _Candidate(GEMV_TILE, 1, 0, 0, 1.0, 1.0, flops / (cuda.flops * profile.cuda_core_fraction), 0.0)


def _check_sizes(**sizes: int) -> None:
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise UsageError(f"GEMM size {name}={value!r} must be a positive integer")


def estimate_gemm(
    m: int,
    n: int,
    k: int,
    *,
    batch: int = 1,
    dtype: str = "bf16",
    gpu: GPU,
    profile: DeviceProfile | None = None,
    tf32: bool = False,
    out_dtype: str | None = None,
    fallback: bool = False,
) -> GemmEstimate:
    """Predict C[M,N] = A[M,K] @ B[K,N] (``batch`` times) of ``dtype`` on ``gpu``.

    ``tf32`` lets fp32 use TF32 tensor cores (Ampere+), as ``torch.backends.cuda.matmul.
    allow_tf32`` does; ``dtype="tf32"`` insists on them. ``out_dtype`` defaults to ``dtype``
    (int32 for int8). ``fallback`` lets a dtype the GPU has no units for run at the rate the
    libraries would substitute (reported in ``note``) instead of raising.
    """
    _check_sizes(M=m, N=n, K=k, batch=batch)
    requested = normalize_dtype(dtype)
    profile = profile or default_profile(gpu)
    if requested == "tf32":
        rate = gpu.peak("tf32", fallback=fallback)
        store = "fp32"
    else:
        rate = gpu.matmul_peak(requested, tf32=tf32, fallback=fallback)
        store = requested
    out = (
        normalize_dtype(out_dtype, allow_output_only=True)
        if out_dtype
        else ("int32" if store == "int8" else store)
    )
    flops = 2.0 * m * n * k * batch
    min_bytes = float(batch * (DTYPE_BYTES[store] * (m * k + k * n) + DTYPE_BYTES[out] * m * n))
    aligned, align_factor, align_note = _alignment(
        {"M": m, "N": n, "K": k}, rate.dtype, rate.unit, gpu, profile
    )
    fraction = profile.math_fraction(rate.unit, rate.dtype, flops, gpu.flops_per_clock_per_sm(rate))
    usable = rate.flops * fraction * align_factor
    model_memory_s = profile.memory_time(gpu.memory_bandwidth, min_bytes)
    candidates = _candidates(m, n, k, batch, flops, usable, gpu, profile)
    cuda = gpu.peak(store, tensor_cores=False) if min(m, n) == 1 and store in gpu.cuda_tflops else None
    gemv = _gemv_candidate(m, n, flops, cuda, profile)
    if gemv is not None:
        candidates.append(gemv)
    best = min(candidates, key=lambda c: max(c.compute_s, model_memory_s) + c.reduction_s)
    if best is gemv and cuda is not None:  # the GEMV kernel runs on CUDA cores: report that unit
        rate = cuda
        fraction, aligned, align_factor = profile.cuda_core_fraction, True, 1.0
        align_note = "matrix-vector product: a GEMV kernel on CUDA cores, no tensor-core alignment rule"
    overhead_s = profile.kernel_overhead_s
    time_s = max(best.compute_s, model_memory_s) + best.reduction_s + overhead_s
    return GemmEstimate(
        m=m,
        n=n,
        k=k,
        batch=batch,
        dtype=requested,
        gpu=gpu.id,
        flops=flops,
        min_bytes=min_bytes,
        intensity=flops / min_bytes,
        ridge=rate.flops / gpu.memory_bandwidth,
        math_unit=rate.unit,
        rate_dtype=rate.dtype,
        peak_flops=rate.flops,
        math_fraction=fraction,
        tile=best.tile,
        tile_relative_efficiency=profile.tile_efficiency(best.tile),
        ctas=best.ctas,
        waves=best.waves,
        tile_efficiency=best.tile_efficiency,
        wave_efficiency=best.wave_efficiency,
        split_k=best.split_k,
        aligned=aligned,
        alignment_factor=align_factor,
        alignment_note=align_note,
        compute_s=flops / rate.flops,
        memory_s=min_bytes / gpu.memory_bandwidth,
        model_compute_s=best.compute_s,
        model_memory_s=model_memory_s,
        reduction_s=best.reduction_s,
        overhead_s=overhead_s,
        time_s=time_s,
        bound="compute" if best.compute_s >= model_memory_s else "memory",
        note=rate.note,
    )
