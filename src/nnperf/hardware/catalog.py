"""The GPU catalog: one TOML file per GPU in ``hardware/gpus/``, each value with its source.

A ``GPU`` answers the questions the time models ask (peak FLOP/s of the unit a dtype runs on,
bytes/s of memory, ridge point), and refuses clearly when a GPU has no unit for a dtype rather
than silently inventing a rate. All peaks are dense (never the 2:4-sparse datasheet figure).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nnperf.errors import UsageError
from nnperf.hardware import names, schema
from nnperf.hardware import overrides as _overrides
from nnperf.hardware.architecture import Architecture, architecture
from nnperf.hardware.dtypes import normalize_dtype

GPU_DIR = Path(__file__).parent / "gpus"

#: When a GPU has no unit for a dtype and the caller allows a fallback, the next dtype to try
#: (what the libraries do: TF32 off on pre-Ampere means fp32, bf16 on Volta is computed in fp32).
FALLBACK: dict[str, str] = {
    "tf32": "fp32",
    "bf16": "fp32",
    "fp16": "fp32",
    "fp8": "bf16",
    "int8": "fp16",
}


@dataclass(frozen=True)
class HostLink:
    """How the GPU talks to the host: PCIe (gen, lanes) or a coherent NVLink-C2C link."""

    kind: str
    gbs_per_direction: float
    gen: int | None = None
    lanes: int | None = None

    def describe(self) -> str:
        if self.kind == "pcie" and self.gen:
            return (
                f"PCIe {self.gen}.0 x{self.lanes or 16}, {self.gbs_per_direction:g} GB/s each way"
            )
        return f"{self.kind}, {self.gbs_per_direction:g} GB/s each way"


@dataclass(frozen=True)
class PeakRate:
    """A peak rate plus where it came from, so a fallback is reported, never silent."""

    flops: float
    unit: str  # "tensor" | "cuda"
    dtype: str  # the rate actually used, e.g. "tf32" for an fp32 GEMM with TF32 on
    requested: str
    note: str = ""


#: Share of the nominal memory the driver keeps when no reading says how much (see
#: ``GPU.usable_memory_bytes``): V100 SXM2, the largest share among the GPUs read, kept 1.4%.
DRIVER_RESERVE = 0.015


@dataclass(frozen=True)
class GPU:
    """One GPU as one PyTorch device sees it (multi-die boards are described per die)."""

    id: str
    name: str
    vendor: str
    architecture: str
    sm_count: int
    boost_clock_mhz: float
    memory_gib: float
    memory_type: str
    memory_bandwidth_gbs: float
    tensor_tflops: Mapping[str, float] = field(default_factory=dict, hash=False)
    cuda_tflops: Mapping[str, float] = field(default_factory=dict, hash=False)
    aliases: tuple[str, ...] = ()
    compute_capability: str | None = None
    tensor_clock_mhz: float | None = None
    #: The product line (``schema.SEGMENTS``); None for a GPU file that does not say.
    segment: str | None = None
    # The clock the card holds under sustained load, where a measurement is published: the
    # datasheet peaks assume the clock they are quoted at, which power-limited cards do not
    # hold and consumer cards exceed (GPU Boost). None: the quoted clock.
    sustained_clock_mhz: float | None = None
    l2_mb: float | None = None
    # Measured L2 read bandwidth and the capacity over which a kernel still finds what an
    # earlier one touched (passes/l2_reuse.py); None where no microbenchmark was found, and
    # then every read is timed at DRAM bandwidth.
    l2_bandwidth_gbs: float | None = None
    l2_reuse_mb: float | None = None
    cuda_total_mib: float | None = None
    host_link: HostLink | None = None
    gpu_link_gbs: float | None = None
    tdp_w: float | None = None
    price_usd_per_hour: float | None = None
    price_date: str | None = None
    confidence: str = "datasheet"
    unverified: tuple[str, ...] = ()
    notes: str = ""
    sources: Mapping[str, str] = field(default_factory=dict, hash=False)
    origin: str = ""
    overrides: tuple[str, ...] = ()

    # ---- derived quantities -------------------------------------------------------------
    @property
    def label(self) -> str:
        """The name as a table header shows it: with the what-ifs applied (``--set``) and the
        user's file it came from, so a saved table is not mistaken for the catalog card's."""
        marks = []
        if self.origin and not self.origin.startswith("built-in"):
            marks.append(f"from {self.origin}")
        if self.overrides:
            marks.append(f"with --set {' '.join(self.overrides)}")
        return f"{self.name} ({'; '.join(marks)})" if marks else self.name

    @property
    def memory_bandwidth(self) -> float:
        """Datasheet memory bandwidth in bytes/s."""
        return self.memory_bandwidth_gbs * 1e9

    @property
    def l2_reuse(self) -> tuple[float, float] | None:
        """(L2 read bandwidth in bytes/s, reuse capacity in bytes) where measured, else None."""
        if self.l2_bandwidth_gbs and self.l2_reuse_mb:
            return self.l2_bandwidth_gbs * 1e9, self.l2_reuse_mb * 1e6
        return None

    @property
    def arch(self) -> Architecture:
        """The architecture's facts (context size, workspaces, alignment preference)."""
        return architecture(self.architecture, self.compute_capability)

    @property
    def memory_bytes(self) -> float:
        """Capacity in bytes; GPU memory sizes are binary (an '80 GB' HBM part holds 80 GiB)."""
        return self.memory_gib * 2**30

    @property
    def usable_memory_bytes(self) -> float:
        """What a process can fill: the memory CUDA reports (``torch.cuda.get_device_properties
        (0).total_memory``), which the CUDA context and the caching allocator's segments share.

        The driver keeps 0.05-1.4% of the nominal size for itself (measured: H100 SXM 81090
        of 81920 MiB, H200 143156 of 144384, V100 16160 of 16384); where the catalog has no
        reading, ``DRIVER_RESERVE`` of the nominal size, the largest share seen, is assumed.
        """
        if self.cuda_total_mib:
            return self.cuda_total_mib * 2**20
        return self.memory_bytes * (1 - DRIVER_RESERVE)

    @property
    def memory_gb(self) -> float:
        return self.memory_bytes / 1e9

    @property
    def short_name(self) -> str:
        return self.id.upper()

    def supported_dtypes(self) -> list[str]:
        """The compute dtypes this GPU has units for, in the catalog's order."""
        have = set(self.tensor_tflops) | set(self.cuda_tflops)
        return [d for d in schema.COMPUTE_DTYPES if d in have]

    # ---- peak rates ---------------------------------------------------------------------
    def clock_scale(self, unit: str) -> float:
        """Sustained clock over the clock the datasheet peak of ``unit`` is quoted at (tensor
        peaks at ``tensor_clock_mhz`` where given, CUDA-core peaks at the boost clock); 1 when
        no sustained clock is known."""
        if not self.sustained_clock_mhz:
            return 1.0
        quoted = (self.tensor_clock_mhz or self.boost_clock_mhz) if unit == "tensor" else self.boost_clock_mhz
        return self.sustained_clock_mhz / quoted

    def _peak_scale(self, unit: str, dtype: str) -> float:
        """``clock_scale`` for a datasheet peak; 1 for a peak the user set (``--set
        peak_tflops...=R`` states the rate the math runs at, not a rate at a quoted clock)."""
        keys = (f"peak_tflops.{dtype}=", f"peak_tflops.{unit}.{dtype}=")
        if dtype == "tf32":  # peak_tflops.fp32 sets TF32 tensor cores too (hardware/overrides.py)
            keys += ("peak_tflops.fp32=",)
        if any(o.startswith(keys) for o in self.overrides):
            return 1.0
        return self.clock_scale(unit)

    def quoted_rate(self, flops: float, unit: str, dtype: str) -> float:
        """``flops``, a rate of ``unit``'s ``dtype`` math at the sustained clock (what ``peak``
        returns), at the clock the datasheet quotes it at instead: MFU divides by the datasheet
        peak (PaLM's and Megatron-LM's convention), whatever clock the GPU holds."""
        return flops / self._peak_scale(unit, dtype)

    def flops_per_clock_per_sm(self, rate: PeakRate) -> float | None:
        """The datasheet rate of ``rate``'s unit per SM and clock (e.g. 512 fp16 FLOP for a
        GeForce RTX 4090's fp32-accumulate tensor math, 4096 for an H100's); None without an SM
        count or clock."""
        clock = (self.tensor_clock_mhz or self.boost_clock_mhz) if rate.unit == "tensor" else self.boost_clock_mhz
        if not self.sm_count or not clock:
            return None
        return rate.flops / self._peak_scale(rate.unit, rate.dtype) / (self.sm_count * clock * 1e6)

    def peak(self, dtype: str, *, tensor_cores: bool = True, fallback: bool = False) -> PeakRate:
        """The peak of ``dtype``: tensor/matrix units when present (and allowed), else CUDA cores.

        Without ``fallback`` a dtype with no unit raises a UsageError naming the valid dtypes;
        with it, the rate of the dtype the libraries would use instead is returned and the
        substitution is described in ``note``.
        """
        requested = normalize_dtype(dtype)
        d = requested
        while True:
            if tensor_cores and d in self.tensor_tflops:
                rate = PeakRate(self.tensor_tflops[d] * 1e12 * self._peak_scale("tensor", d), "tensor", d, requested)
                break
            if d in self.cuda_tflops:
                rate = PeakRate(self.cuda_tflops[d] * 1e12 * self._peak_scale("cuda", d), "cuda", d, requested)
                break
            if not fallback or d not in FALLBACK:
                units = "" if tensor_cores else "CUDA-core "
                valid = self.supported_dtypes() if tensor_cores else list(self.cuda_tflops)
                raise UsageError(
                    f"{self.short_name} has no {units}{requested} units; "
                    f"valid dtypes: {', '.join(valid)}"
                )
            d = FALLBACK[d]
        if d != requested:
            note = (
                f"{self.short_name} has no {requested} units; using its {rate.unit}-core "
                f"{d} rate instead"
            )
            rate = PeakRate(rate.flops, rate.unit, d, requested, note)
        return rate

    def peak_flops(self, dtype: str, *, tensor_cores: bool = True, fallback: bool = False) -> float:
        """Peak FLOP/s (OP/s for int8) of ``dtype``; see ``peak`` for the rules."""
        return self.peak(dtype, tensor_cores=tensor_cores, fallback=fallback).flops

    def matmul_peak(self, dtype: str, *, tf32: bool = False, fallback: bool = False) -> PeakRate:
        """The unit and peak a matrix product of ``dtype`` runs at, as cuBLAS/rocBLAS pick it.

        fp32 uses TF32 tensor cores only when ``tf32`` is on and the GPU has them (Ampere+);
        otherwise fp32 matrix units where they exist (AMD CDNA), else CUDA cores.
        """
        d = normalize_dtype(dtype)
        if d == "fp32" and tf32 and "tf32" in self.tensor_tflops:
            return self.peak("tf32")
        return self.peak(d, fallback=fallback)

    def math_unit(self, dtype: str, tf32: bool = False) -> str:
        """'tensor' or 'cuda': where a matrix product of ``dtype`` runs."""
        return self.matmul_peak(dtype, tf32=tf32).unit

    def ridge_point(self, dtype: str, *, tf32: bool = False) -> float:
        """FLOP per byte above which a kernel is compute-bound (datasheet peak / bandwidth)."""
        return self.matmul_peak(dtype, tf32=tf32).flops / self.memory_bandwidth

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view (used by ``nnperf gpus NAME --json``)."""
        out: dict[str, Any] = {}
        for key in self.__dataclass_fields__:
            value = getattr(self, key)
            if isinstance(value, HostLink):
                value = {k: v for k, v in vars(value).items() if v is not None}
            elif isinstance(value, Mapping):
                value = dict(value)
            elif isinstance(value, tuple):
                value = list(value)
            out[key] = value
        out["memory_gb"] = self.memory_gb
        return out


# ---- loading ----------------------------------------------------------------------------
def _build(raw: dict[str, Any], gpu_id: str, origin: str, applied: tuple[str, ...] = ()) -> GPU:
    kwargs = schema.validate(raw, origin)
    if kwargs.get("sustained_clock_mhz") and "sustained_clock" not in kwargs.get("sources", {}) \
            and not any(a.startswith("sustained_clock_mhz=") for a in applied):
        raise UsageError(f"{origin}: sustained_clock_mhz needs its measurement named in "
                         "[sources] sustained_clock = \"...\"")
    _check_l2(kwargs, origin, applied)
    kwargs.pop("id", None)
    link = kwargs.pop("host_link", None)
    return GPU(
        id=gpu_id,
        host_link=HostLink(**link) if link else None,
        origin=origin,
        overrides=applied,
        **kwargs,
    )


def _check_l2(fields: dict[str, Any], origin: str, applied: tuple[str, ...]) -> None:
    """The L2 reuse fields come from one measurement: both or neither, named in [sources] l2
    (a what-if ``--set`` needs no source; 0 switches the model off), a reuse capacity within
    the L2 and an L2 faster than DRAM (else its floor would slow the reads it serves)."""
    if applied:
        origin = f"{origin} with --set {' '.join(applied)}"
    given = [k for k in ("l2_bandwidth_gbs", "l2_reuse_mb") if fields.get(k) is not None]
    if len(given) == 1:
        raise UsageError(f"{origin}: {given[0]} needs its partner: l2_bandwidth_gbs and l2_reuse_mb come "
                         "from one L2 measurement, so give both (0 for either turns L2 reuse off) or neither")
    if not given or not (fields["l2_bandwidth_gbs"] and fields["l2_reuse_mb"]):
        return
    what_if = any(a.startswith(("l2_bandwidth_gbs=", "l2_reuse_mb=")) for a in applied)
    if "l2" not in fields.get("sources", {}) and not what_if:
        raise UsageError(f"{origin}: l2_bandwidth_gbs and l2_reuse_mb need their measurement named in "
                         "[sources] l2 = \"...\"")
    if fields.get("l2_mb") and fields["l2_reuse_mb"] > fields["l2_mb"] * 1.05:  # MB vs MiB
        raise UsageError(f"{origin}: l2_reuse_mb {fields['l2_reuse_mb']:g} is more than the L2 "
                         f"(l2_mb {fields['l2_mb']:g}): at most l2_mb")
    if fields["l2_bandwidth_gbs"] <= fields["memory_bandwidth_gbs"]:
        raise UsageError(f"{origin}: l2_bandwidth_gbs {fields['l2_bandwidth_gbs']:g} is not above the DRAM "
                         f"bandwidth ({fields['memory_bandwidth_gbs']:g} GB/s): give the L2's measured bandwidth, "
                         "or 0 to turn L2 reuse off")


@functools.lru_cache(maxsize=1)
def _builtin_raw() -> dict[str, tuple[dict[str, Any], str]]:
    """id -> (raw table, origin for messages) for every built-in GPU file."""
    out = {}
    for path in sorted(GPU_DIR.glob("*.toml")):
        out[path.stem] = (schema.read_toml(path, "GPU file"), schema.origin_of(path))
    return out


def list_gpus() -> list[GPU]:
    """Every built-in GPU, in file-name order."""
    return [_build(raw, gid, where) for gid, (raw, where) in _builtin_raw().items()]


def load_gpu(
    name: str | None,
    *,
    gpu_file: str | Path | None = None,
    overrides: dict[str, str] | None = None,
) -> GPU:
    """Find a GPU by any common spelling, optionally adding a user file and what-if overrides.

    ``gpu_file`` adds one GPU (same schema as the built-in files); with ``name`` empty the
    file's GPU is returned. ``overrides`` maps dotted schema keys to values (``--set``).
    """
    candidates = dict(_builtin_raw())
    user_id = None
    if gpu_file is not None:
        path = Path(gpu_file)
        raw = schema.read_toml(path, "GPU file")
        user_id = str(raw.get("id") or path.stem)
        _build(raw, user_id, schema.origin_of(path))  # validate the file as written
        candidates[user_id] = (raw, schema.origin_of(path))
    if not name:
        if user_id is None:
            raise UsageError("no GPU given; pass a GPU name (see 'nnperf gpus') or --gpu-file")
        gpu_id = user_id
    elif user_id is not None and names.normalize(name) in {
        names.normalize(s)
        for s in [
            user_id,
            candidates[user_id][0].get("name", ""),
            *candidates[user_id][0].get("aliases", []),
        ]
    }:
        gpu_id = user_id  # the user's file wins over a built-in entry of the same name
    else:
        index = {
            gid: [raw.get("name", ""), *raw.get("aliases", [])]
            for gid, (raw, _) in candidates.items()
        }
        gpu_id = names.resolve(name, index)
    raw, where = candidates[gpu_id]
    if overrides:
        raw = _overrides.apply_overrides(raw, overrides)
        if "memory_gib" in overrides and "cuda_total_mib" not in overrides:
            # a what-if on the size makes the reading of the real card moot
            raw = {k: v for k, v in raw.items() if k != "cuda_total_mib"}
        applied = tuple(f"{k}={v}" for k, v in overrides.items())
        return _build(raw, gpu_id, where, applied)
    return _build(raw, gpu_id, where)
