"""The schema of a GPU file, checked field by field so a bad file fails with a useful line.

Built-in entries and user files (``--gpu-file``) go through the same checks, and so do
what-if overrides (``--set``), which are applied to the raw TOML table before validation.

A GPU file is a TOML table with these keys (see any file in ``hardware/gpus/`` for an example)::

    name, aliases, vendor, architecture, segment, compute_capability, confidence, unverified, notes,
    sm_count, boost_clock_mhz, tensor_clock_mhz, memory_gib, cuda_total_mib, memory_type,
    memory_bandwidth_gbs, l2_mb, l2_bandwidth_gbs, l2_reuse_mb, gpu_link_gbs, tdp_w,
    price_usd_per_hour, price_date,
    [host_link] kind, gen, lanes, gbs_per_direction
    [peak_tflops.tensor] / [peak_tflops.cuda]  <dtype> = dense TFLOP/s (TOPS for int8)
    [sources] <what> = "title, URL"
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nnperf.errors import UsageError, read_user_text, shown
from nnperf.hardware.dtypes import COMPUTE_DTYPES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

#: Rates that exist only as extra information: the fp16-accumulate rate GeForce cards quote as
#: their headline (PyTorch accumulates fp16 GEMMs in fp32, which is what ``fp16`` holds).
EXTRA_RATE_KEYS: tuple[str, ...] = ("fp16_acc16", "fp8_acc16")
RATE_KEYS: tuple[str, ...] = COMPUTE_DTYPES + EXTRA_RATE_KEYS
UNITS: tuple[str, ...] = ("tensor", "cuda")
#: The product lines a GPU is sold in (the vendor's own division: NVIDIA's data-centre parts
#: against GeForce). A prediction's track record (``nnperf.accuracy``) compares a GPU with
#: measured ones of its segment: servers and desktops differ in host, clocks and cooling.
SEGMENTS: tuple[str, ...] = ("data-centre", "workstation", "consumer")

# kind: "str", "int", "float" (positive), "strlist". required: must be present.
SCALAR_FIELDS: dict[str, tuple[str, bool, str]] = {
    "id": ("str", False, "a short identifier such as 'my-gpu'"),
    "name": ("str", True, "the display name, e.g. 'H100 SXM5 80GB'"),
    "aliases": ("strlist", False, "a list of other spellings"),
    "vendor": ("str", True, "e.g. 'NVIDIA' or 'AMD'"),
    "architecture": ("str", True, "e.g. 'Hopper', 'Ampere', 'CDNA3'"),
    "segment": ("str", False, "the product line: " + ", ".join(repr(s) for s in SEGMENTS)),
    "compute_capability": ("str", False, "e.g. '9.0' (NVIDIA) or 'gfx942' (AMD)"),
    "confidence": ("str", False, "'datasheet' or 'unverified'"),
    "unverified": ("strlist", False, "names of fields not checked against a primary source"),
    "notes": ("str", False, "free text"),
    "sm_count": ("int", True, "a positive number of SMs (CUs on AMD)"),
    "boost_clock_mhz": ("float", True, "a positive clock in MHz"),
    "tensor_clock_mhz": ("float", False, "the positive clock (MHz) tensor peaks are quoted at"),
    "sustained_clock_mhz": ("float", False, "the SM clock (MHz) measured under sustained load; "
                            "peaks are scaled to it (needs [sources] sustained_clock)"),
    "memory_gib": ("float", True, "a positive capacity in GiB"),
    "cuda_total_mib": ("float", False, "the memory CUDA reports (torch total_memory) in MiB"),
    "memory_type": ("str", True, "e.g. 'HBM3'"),
    "memory_bandwidth_gbs": ("float", True, "a positive bandwidth in GB/s (1e9 bytes/s)"),
    "l2_mb": ("float", False, "a positive L2 size in MB"),
    "l2_bandwidth_gbs": ("float", False, "the L2 read bandwidth (GB/s) a microbenchmark measured; with "
                         "l2_reuse_mb, data a recent kernel touched is read from L2 (needs [sources] l2; "
                         "0 turns L2 reuse off)"),
    "l2_reuse_mb": ("float", False, "the MB a later kernel still finds in L2 (where the measured L2 "
                    "bandwidth starts to fall; needs [sources] l2)"),
    "gpu_link_gbs": ("float", False, "total GPU-to-GPU link bandwidth in GB/s"),
    "tdp_w": ("float", False, "board power in W"),
    "price_usd_per_hour": ("float", False, "on-demand USD per GPU-hour"),
    "price_date": ("str", False, "when the price was seen, e.g. '2025-06'"),
}
HOST_LINK_FIELDS: dict[str, tuple[str, bool, str]] = {
    "kind": ("str", True, "'pcie' or 'nvlink-c2c'"),
    "gen": ("int", False, "the PCIe generation, e.g. 5"),
    "lanes": ("int", False, "the number of lanes, e.g. 16"),
    "gbs_per_direction": ("float", True, "GB/s in each direction"),
}
TABLES = ("host_link", "peak_tflops", "sources")


@dataclass(frozen=True)
class Range:
    """The values a number may take: finite, in (low, high] (or [low, high] when
    ``low_closed``), an integer when ``integer``. Every numeric field of a GPU file and of a
    device profile has one, so ``--gpu-file``, ``--set`` and ``--profile`` refuse the same
    values with the same words (nan, inf, 1e308, a fraction of 5 would each give a
    prediction that means nothing)."""

    low: float
    high: float
    integer: bool = False
    low_closed: bool = False

    def admits(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.integer and not isinstance(value, int):
            return False
        if isinstance(value, float) and not math.isfinite(value):
            return False
        above = value >= self.low if self.low_closed else value > self.low
        return above and value <= self.high

    def describe(self) -> str:
        if self.integer:
            return f"an integer from {_num(self.low)} to {_num(self.high)}"
        return f"a finite number in {'[' if self.low_closed else '('}{_num(self.low)}, {_num(self.high)}]"


def _num(x: float) -> str:
    """1e6 -> '1,000,000', 3e-6 -> '3e-06': bounds as a reader types them."""
    return f"{int(x):,}" if float(x).is_integer() and abs(x) < 1e16 else f"{x:g}"


#: A fraction of a peak (or a relative efficiency of at most 1).
FRACTION = Range(0, 1)
#: A kernel's speed relative to another's on the same work (FlexAttention's against flash's).
RELATIVE_SPEED = Range(0, 4)
#: Every peak rate in TFLOP/s (TOPS for int8): up to 1 EFLOP/s per device, 100x the largest
#: dense rate of any catalog GPU (B200 fp8: 4,500).
RATE = Range(0, 1e6)

#: The valid range of every numeric GPU field (``peak_tflops`` covers every unit and dtype).
GPU_RANGES: dict[str, Range] = {
    "sm_count": Range(1, 100_000, integer=True, low_closed=True),
    "boost_clock_mhz": Range(0, 100_000),
    "tensor_clock_mhz": Range(0, 100_000),
    "sustained_clock_mhz": Range(0, 100_000),
    "memory_gib": Range(0, 2**20),  # 1 PiB: a device description of a big host fits
    "cuda_total_mib": Range(0, 2**30),
    "memory_bandwidth_gbs": Range(0, 1e6),  # 1 PB/s; H200: 4,800
    "l2_mb": Range(0, 1e5),
    "l2_bandwidth_gbs": Range(0, 1e7, low_closed=True),  # 0: L2 reuse off
    "l2_reuse_mb": Range(0, 1e5, low_closed=True),
    "gpu_link_gbs": Range(0, 1e5),
    "tdp_w": Range(0, 1e5),
    "price_usd_per_hour": Range(0, 1e4),
    "host_link.gen": Range(1, 10, integer=True, low_closed=True),
    "host_link.lanes": Range(1, 64, integer=True, low_closed=True),
    "host_link.gbs_per_direction": Range(0, 1e5),
    "peak_tflops": RATE,
}


#: The valid range of every number in a device profile (``--profile``, the shipped defaults).
#: Per-kernel and per-op times up to 1 s (no kernel launch or dispatch costs that much);
#: ``conv_efficiency`` (per convolution class) compares a convolution with a GEMM and may
#: exceed 1; ``conv_efficiency_scale`` multiplies it (the calibration clamps its measurement
#: to 0.05..2).
PROFILE_RANGES: dict[str, Range] = {
    "gemm_peak_fraction": FRACTION,
    "low_rate_tensor_fraction": FRACTION,
    "cuda_core_fraction": FRACTION,
    "bandwidth_fraction": FRACTION,
    "attention_forward_fraction": FRACTION,
    "attention_backward_fraction": FRACTION,
    "efficient_attention_forward_scale": FRACTION,
    "efficient_attention_backward_scale": FRACTION,
    "efficient_attention_scale": FRACTION,  # both of them (profiles calibrated before they were split)
    "flex_attention_forward_scale": RELATIVE_SPEED,
    "flex_attention_backward_scale": RELATIVE_SPEED,
    "cudnn_attention_forward_scale": RELATIVE_SPEED,
    "cudnn_attention_backward_scale": RELATIVE_SPEED,
    "wide_head_attention": RELATIVE_SPEED,  # per kernel pass
    "gemm_peak_fraction_by_dtype": FRACTION,  # per dtype
    "conv_efficiency": Range(0, 2),  # per convolution class
    "conv_efficiency_scale": Range(0, 2),
    "bandwidth_half_bytes": Range(0, 2**50),
    "kernel_overhead_s": Range(0, 1),
    "host_dispatch_s": Range(0, 1),
    "host_python_call_s": Range(0, 1, low_closed=True),
    "host_autograd_record_s": Range(0, 1, low_closed=True),
    "host_view_autograd_s": Range(0, 1, low_closed=True),
    "host_module_call_s": Range(0, 1, low_closed=True),
    "host_module_hook_s": Range(0, 1, low_closed=True),
    "host_autocast_op_s": Range(0, 1, low_closed=True),
    "host_backward_node_s": Range(0, 1, low_closed=True),
    "host_backward_call_s": Range(0, 1, low_closed=True),
    "host_zero_grad_param_s": Range(0, 1, low_closed=True),
    "host_sync_s": Range(0, 1, low_closed=True),
    "host_in_context": Range(1, 10, low_closed=True),
    "host_optimizer_step_s": Range(0, 1, low_closed=True),
    "host_optimizer_param_s": Range(0, 1, low_closed=True),
    "host_view_s": Range(0, 1),
    "host_dtensor_dispatch_s": Range(0, 1, low_closed=True),
    "host_dtensor_list_tensor_s": Range(0, 1, low_closed=True),
    "host_dispatch_by_kind_s": Range(0, 1),  # per op category
    "host_turbo_ghz": Range(0.1, 10),
    "split_k_max": Range(1, 1024, integer=True, low_closed=True),
    "split_k_min_k": Range(1, 2**31 - 1, integer=True, low_closed=True),
    "foreach_tensors_per_kernel": Range(1, 1e6, low_closed=True),
    "loop_iteration_cycles": Range(1, 1e6, low_closed=True),
    "cudnn_batch_norm_loop_fraction": Range(0, 10, low_closed=False),
    "layout_transpose_bytes_per_clock_sm": Range(0, 1e4, low_closed=True),  # 0: DRAM speed
    "low_rate_flops_per_clock_sm": Range(1, 1e5, low_closed=True),
    "tile_relative_efficiency": FRACTION,  # per tile
    "alignment_penalty": FRACTION,  # per alignment class
    "ctas_per_sm": Range(1, 64, integer=True, low_closed=True),  # per tile
    "tile_side": Range(1, 4096, integer=True, low_closed=True),  # Tm and Tn of a tile name
    "bandwidth_curve.bytes": Range(0, 2**60),
    "bandwidth_curve.bytes_per_s": Range(0, 1e15),  # 1 PB/s, as memory_bandwidth_gbs
    "gemm_efficiency.flops": Range(0, 1e21),
    "depthwise_rate.taps": Range(1, 1e6, low_closed=True),
    "depthwise_rate.macs": Range(0, 1e5),
    "gemm_efficiency.fraction": FRACTION,
}


def range_of(field: str) -> Range:
    """The range of a dotted GPU field (``peak_tflops.tensor.bf16`` -> the rate range)."""
    return GPU_RANGES["peak_tflops" if field.startswith("peak_tflops.") else field]


def read_toml(path: Path, what: str) -> dict[str, Any]:
    """A TOML file's table; a missing, unreadable, binary or malformed file is a usage error
    naming ``what`` and the file."""
    text = read_user_text(path, what, "a TOML file")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise UsageError(f"{what} {shown(path)} is not valid TOML: {err}") from None


def valid_keys() -> list[str]:
    """Every dotted key ``--set`` accepts, in file order (``sources`` is not settable)."""
    keys = [k for k in SCALAR_FIELDS if k != "id"]
    keys += [f"host_link.{k}" for k in HOST_LINK_FIELDS]
    keys += [f"peak_tflops.{unit}.{d}" for unit in UNITS for d in RATE_KEYS]
    return keys


def _bad(origin: str, field: str, expected: str, got: Any = None) -> UsageError:
    got_text = "missing" if got is None else f"got {got!r}"
    return UsageError(f"{origin}: field '{field}' is {got_text}; expected {expected}")


def _check(origin: str, field: str, kind: str, value: Any, expected: str) -> Any:
    if kind == "str":
        if not isinstance(value, str) or not value.strip():
            raise _bad(origin, field, expected, value)
        return value.strip()
    if kind == "strlist":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise _bad(origin, field, expected, value)
        return tuple(value)
    valid = range_of(field)
    if not valid.admits(value):
        raise _bad(origin, field, f"{expected}, {valid.describe()}", value)
    return value if kind == "int" else float(value)


def _fields(origin: str, table: dict, spec: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, (kind, required, expected) in spec.items():
        if key in table:
            out[key] = _check(origin, prefix + key, kind, table[key], expected)
        elif required:
            raise _bad(origin, prefix + key, expected)
    return out


def _rates(origin: str, table: Any, unit: str) -> dict[str, float]:
    where = f"peak_tflops.{unit}"
    if table is None:
        return {}
    if not isinstance(table, dict):
        raise _bad(origin, where, "a table of <dtype> = TFLOP/s", table)
    rates = {}
    for key, value in table.items():
        if key not in RATE_KEYS:
            raise UsageError(
                f"{origin}: unknown key '{where}.{key}'; valid dtypes: {', '.join(RATE_KEYS)}"
            )
        rates[key] = _check(origin, f"{where}.{key}", "float", value, "positive dense TFLOP/s")
    return rates


def validate(raw: dict[str, Any], origin: str) -> dict[str, Any]:
    """Check a raw GPU table and return the keyword arguments of ``GPU`` (without ``id``)."""
    unknown = sorted(set(raw) - set(SCALAR_FIELDS) - set(TABLES))
    if unknown:
        raise UsageError(
            f"{origin}: unknown field '{unknown[0]}'; valid fields: "
            f"{', '.join([*SCALAR_FIELDS, *TABLES])}"
        )
    out = _fields(origin, raw, SCALAR_FIELDS)
    if out.get("segment") is not None and out["segment"] not in SEGMENTS:
        raise _bad(origin, "segment", SCALAR_FIELDS["segment"][2], out["segment"])
    link = raw.get("host_link")
    if link is not None:
        if not isinstance(link, dict):
            raise _bad(origin, "host_link", "a table with kind and gbs_per_direction", link)
        extra = sorted(set(link) - set(HOST_LINK_FIELDS))
        if extra:
            raise UsageError(
                f"{origin}: unknown field 'host_link.{extra[0]}'; valid: "
                f"{', '.join(HOST_LINK_FIELDS)}"
            )
        out["host_link"] = _fields(origin, link, HOST_LINK_FIELDS, "host_link.")
    peaks = raw.get("peak_tflops", {})
    if not isinstance(peaks, dict) or set(peaks) - set(UNITS):
        raise _bad(
            origin, "peak_tflops", "tables [peak_tflops.tensor] and [peak_tflops.cuda]", peaks
        )
    out["tensor_tflops"] = _rates(origin, peaks.get("tensor"), "tensor")
    out["cuda_tflops"] = _rates(origin, peaks.get("cuda"), "cuda")
    if "fp32" not in out["cuda_tflops"]:
        raise _bad(origin, "peak_tflops.cuda.fp32", "the positive FP32 CUDA-core TFLOP/s")
    sources = raw.get("sources", {})
    if not isinstance(sources, dict) or not all(isinstance(v, str) for v in sources.values()):
        raise _bad(origin, "sources", 'a table of <what> = "title, URL"', sources)
    out["sources"] = dict(sources)
    return out


def origin_of(path: Path | str) -> str:
    """How a file is named in messages and in ``--json`` output: a file shipped with nnperf by
    its place in the package (the same on every machine), a user's file by the path given."""
    package = Path(__file__).resolve().parent.parent
    try:
        inside = Path(path).resolve().relative_to(package)
    except ValueError:
        return f"GPU file {str(path)!r}"
    return f"built-in GPU file 'nnperf/{inside.as_posix()}'"
