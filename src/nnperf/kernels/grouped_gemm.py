"""A grouped GEMM (``torch._grouped_mm``: one GEMM per expert of a mixture of experts) on a GPU.

How PyTorch runs it on CUDA (``aten/src/ATen/native/cuda/GroupedBlas.cpp``, ``_grouped_mm_cuda``):

- bf16 operands and output on compute capability 9.x or 10.x
  (``_scaled_mm_allowed_device(sm90_only, sm100_only)``): ``bf16bf16_grouped_mm``
  (``aten/src/ATen/native/cuda/GroupMM.cu``), CUTLASS 3's grouped GEMM
  (``GemmUniversalMode::kGrouped``): one launch, offsets read on the device. Its tile
  scheduler walks the output tiles of every group in one persistent grid, so each group pays
  its own tile quantization (its rows padded to the tile) and the waves are those of all the
  groups' tiles together;
- anything else: ``_grouped_mm_fallback`` (``aten/src/ATen/native/GroupedMMUtils.h``) copies the
  offsets to the host (``offs.cpu()``: a device-to-host synchronization) and runs one ``mm``
  per group, or one ``bmm`` when both operands are 3-D.

Megatron-Core runs its experts through Transformer Engine's ``GroupedLinear`` instead
(``TEGroupedMLP``), whose GEMMs (``general_grouped_gemm`` -> ``nvte_multi_tensor_gemm``) are one
cuBLAS GEMM per group, issued round-robin on TE's compute streams
(``transformer_engine/common/gemm/cublaslt_gemm.cu``, ``multi_stream_cublas_gemm``: group ``i``
on stream ``i % num_streams``; ``nvte_get_num_compute_streams``, 4 by default:
``transformer_engine/common/include/transformer_engine/multi_stream.h``), unless
``NVTE_USE_CUTLASS_GROUPED_GEMM`` asks for CUTLASS's grouped kernel (off by default, read at TE
``d0067d0``, 2026-08). So at most four groups' GEMMs share the SMs at once: the groups are timed
in consecutive rounds of four, each round's tiles together as one grid (its waves, its kernel
overhead), the rounds one after another: sixteen experts of 512 rows fill four partial grids
where CUTLASS's one grid holds all their tiles.

The compute rate and its achievable fraction are ``kernels.gemm``'s for the same dtype, so a
grouped GEMM of one group costs what a GEMM does (plus nothing); the bytes are the operands
once (the input rows, each group's weight, the output) at the achievable bandwidth.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nnperf.hardware import GPU, DeviceProfile
from nnperf.kernels.engines import PYTORCH, TRANSFORMER_ENGINE
from nnperf.kernels.gemm import estimate_gemm, tile_quantization, wave_quantization

#: The op this model times, as a trace names it: the passes cost it, the trace passes find a
#: mixture of experts' GEMMs by it.
GROUPED_MM = "aten._grouped_mm"

CUTLASS = "cutlass_grouped"
FALLBACK = "mm_per_group"
TE_STREAMS = "te_multi_stream"

#: The compute streams Transformer Engine spreads a grouped GEMM's cuBLAS GEMMs over
#: (``multi_stream.h``: ``num_streams = 4``; the module docstring).
TE_COMPUTE_STREAMS = 4


def grouped_mm_path(dtype: str, gpu: GPU, engine: str = PYTORCH) -> str:
    """Which implementation runs a grouped GEMM of ``dtype`` on ``gpu``: PyTorch's
    ``_grouped_mm_cuda``, or Transformer Engine's ``GroupedLinear`` (``engine``: its streams on
    any GPU, never PyTorch's host-synced fallback; the ROCm port's own path is not read here)."""
    if engine == TRANSFORMER_ENGINE:
        return TE_STREAMS
    parts = (gpu.compute_capability or "").split(".")
    major = int(parts[0]) if gpu.vendor == "NVIDIA" and parts and parts[0].isdigit() else 0
    return CUTLASS if dtype == "bf16" and major in (9, 10) else FALLBACK


@dataclass(frozen=True)
class GroupedGemmEstimate:
    """One grouped GEMM's predicted time. ``groups``: (M, N, K) per non-empty group."""

    groups: tuple[tuple[int, int, int], ...]
    path: str
    flops: float
    min_bytes: float
    peak_flops: float
    rate_dtype: str
    math_unit: str
    tile: tuple[int, int]
    ctas: int
    waves: int
    tile_efficiency: float
    wave_efficiency: float
    compute_s: float  # FLOPs at the unit's peak (roofline)
    memory_s: float  # bytes at the datasheet bandwidth (roofline)
    model_compute_s: float
    model_memory_s: float
    overhead_s: float
    kernels: int
    time_s: float
    host_sync: bool  # the fallback reads the offsets on the host first

    @property
    def bound(self) -> str:
        return "compute" if self.model_compute_s >= self.model_memory_s else "memory"


def estimate_grouped_gemm(
    groups: Sequence[tuple[int, int, int]], *, dtype: str, gpu: GPU, profile: DeviceProfile,
    min_bytes: float, tf32: bool = False, batched: bool = False, engine: str = PYTORCH,
) -> GroupedGemmEstimate:
    """Time the groups' GEMMs as ``engine`` runs them on ``gpu`` (module docstring).
    ``batched``: both operands 3-D (equal groups; PyTorch's fallback is one ``bmm``)."""
    groups = tuple(g for g in groups if min(g) > 0)
    flops = float(sum(2 * m * n * k for m, n, k in groups))
    path = grouped_mm_path(dtype, gpu, engine)
    if not groups:
        return _empty(path, dtype, gpu, min_bytes)
    if path == FALLBACK:
        return _fallback(groups, dtype, gpu, profile, min_bytes, flops, tf32, batched)
    size = TE_COMPUTE_STREAMS if path == TE_STREAMS else len(groups)
    grids = [_grid(groups[i:i + size], dtype, gpu, profile, tf32) for i in range(0, len(groups), size)]
    memory = profile.memory_time(gpu.memory_bandwidth, min_bytes)
    overhead = profile.kernel_overhead_s
    compute = sum(g.compute_s for g in grids)
    # each grid moves its share (by FLOPs) of the operands' bytes, bound by the larger term
    time = sum(max(g.compute_s, memory * (g.flops / flops)) + overhead for g in grids)
    # reported: the first grid's tile and CTA slots, the CTAs and waves of all grids
    first = grids[0]
    slots = gpu.sm_count * profile.tile_ctas_per_sm(first.tile)
    ctas, waves = sum(g.ctas for g in grids), sum(g.waves for g in grids)
    useful = sum(m * n for m, n, _ in groups)
    return GroupedGemmEstimate(
        groups, path, flops, min_bytes, first.peak_flops, first.rate_dtype, first.math_unit, first.tile,
        ctas, waves, useful / sum(g.padded for g in grids), ctas / (waves * slots), flops / first.peak_flops, min_bytes / gpu.memory_bandwidth, compute, memory,
        overhead * len(grids), len(groups) if path == TE_STREAMS else 1, time, False,
    )


@dataclass(frozen=True)
class _Grid:
    """Groups whose tiles run as one grid: their tile (the fastest), FLOPs and compute time."""

    tile: tuple[int, int]
    flops: float
    compute_s: float
    ctas: int
    waves: int
    padded: float  # output elements the tiles cover
    peak_flops: float
    rate_dtype: str
    math_unit: str


def _grid(groups: tuple[tuple[int, int, int], ...], dtype: str, gpu: GPU, profile: DeviceProfile,
          tf32: bool) -> _Grid:
    """The groups' tiles in one grid: each group pays its own tile quantization (its rows padded
    to the tile), the waves are those of all their tiles; the rate, its achievable fraction and
    the alignment factor are those of one GEMM of all their rows."""
    flops = float(sum(2 * m * n * k for m, n, k in groups))
    m_all = sum(m for m, _, _ in groups)
    ref = estimate_gemm(m_all, groups[0][1], groups[0][2], dtype=dtype, gpu=gpu, profile=profile,
                        tf32=tf32, fallback=True)
    usable = ref.peak_flops * ref.math_fraction * ref.alignment_factor
    best = None
    for tile in profile.tiles():
        tiles, useful, padded = 0, 0, 0.0
        for m, n, _ in groups:
            count, eff = tile_quantization(m, n, tile)
            tiles += count
            useful += m * n
            padded += m * n / eff
        waves, wave_eff = wave_quantization(tiles, gpu.sm_count, profile.tile_ctas_per_sm(tile))
        compute = flops / (usable * profile.tile_efficiency(tile) * (useful / padded) * wave_eff)
        if best is None or compute < best.compute_s:
            best = _Grid(tile, flops, compute, tiles, waves, padded, ref.peak_flops, ref.rate_dtype, ref.math_unit)
    return best


def _fallback(groups, dtype, gpu, profile, min_bytes, flops, tf32, batched) -> GroupedGemmEstimate:
    """One ``mm`` per group after reading the offsets on the host; one ``bmm`` for 3-D x 3-D."""
    if batched:
        m, n, k = groups[0]
        ests = [estimate_gemm(m, n, k, batch=len(groups), dtype=dtype, gpu=gpu, profile=profile,
                              tf32=tf32, fallback=True)]
    else:
        ests = [estimate_gemm(m, n, k, dtype=dtype, gpu=gpu, profile=profile, tf32=tf32, fallback=True)
                for m, n, k in groups]
    first = ests[0]
    return GroupedGemmEstimate(
        groups, FALLBACK, flops, min_bytes, first.peak_flops, first.rate_dtype, first.math_unit,
        first.tile, sum(e.ctas for e in ests), sum(e.waves for e in ests),
        first.tile_efficiency, first.wave_efficiency, flops / first.peak_flops,
        min_bytes / gpu.memory_bandwidth, sum(e.model_compute_s for e in ests),
        sum(e.model_memory_s for e in ests), sum(e.overhead_s for e in ests), len(ests),
        sum(e.time_s for e in ests), not batched,
    )


def _empty(path: str, dtype: str, gpu: GPU, min_bytes: float) -> GroupedGemmEstimate:
    rate = gpu.matmul_peak(dtype, fallback=True)
    return GroupedGemmEstimate((), path, 0.0, min_bytes, rate.flops, rate.dtype, rate.unit, (0, 0),
                               0, 0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0.0, False)


def even_split(total: int, groups: int) -> list[int]:
    """``total`` rows over ``groups`` as evenly as integers allow (the first groups one more)."""
    base, extra = divmod(total, groups)
    return [base + (1 if g < extra else 0) for g in range(groups)]


def sizes_from_offsets(offsets: Sequence[int], total: int) -> list[int]:
    """Group sizes from ``_grouped_mm``'s cumulative end offsets (clipped to ``total``)."""
    out, start = [], 0
    for end in offsets:
        end = min(max(int(end), start), total)
        out.append(end - start)
        start = end
    return out

