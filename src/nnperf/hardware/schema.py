"""The schema of a GPU file, checked field by field so a bad file fails with a useful line.

Built-in entries and user files (``--gpu-file``) go through the same checks, and so do
what-if overrides (``--set``), which are applied to the raw TOML table before validation.

A GPU file is a TOML table with these keys (see any file in ``hardware/gpus/`` for an example)::

    name, aliases, vendor, architecture, compute_capability, confidence, unverified, notes,
    sm_count, boost_clock_mhz, tensor_clock_mhz, memory_gib, cuda_total_mib, memory_type,
    memory_bandwidth_gbs, l2_mb, gpu_link_gbs, tdp_w, price_usd_per_hour, price_date,
    [host_link] kind, gen, lanes, gbs_per_direction
    [peak_tflops.tensor] / [peak_tflops.cuda]  <dtype> = dense TFLOP/s (TOPS for int8)
    [sources] <what> = "title, URL"
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from nnperf.errors import UsageError
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

# kind: "str", "int", "float" (positive), "strlist". required: must be present.
SCALAR_FIELDS: dict[str, tuple[str, bool, str]] = {
    "id": ("str", False, "a short identifier such as 'my-gpu'"),
    "name": ("str", True, "the display name, e.g. 'H100 SXM5 80GB'"),
    "aliases": ("strlist", False, "a list of other spellings"),
    "vendor": ("str", True, "e.g. 'NVIDIA' or 'AMD'"),
    "architecture": ("str", True, "e.g. 'Hopper', 'Ampere', 'CDNA3'"),
    "compute_capability": ("str", False, "e.g. '9.0' (NVIDIA) or 'gfx942' (AMD)"),
    "confidence": ("str", False, "'datasheet' or 'unverified'"),
    "unverified": ("strlist", False, "names of fields not checked against a primary source"),
    "notes": ("str", False, "free text"),
    "sm_count": ("int", True, "a positive number of SMs (CUs on AMD)"),
    "boost_clock_mhz": ("float", True, "a positive clock in MHz"),
    "tensor_clock_mhz": ("float", False, "the positive clock (MHz) tensor peaks are quoted at"),
    "memory_gib": ("float", True, "a positive capacity in GiB"),
    "cuda_total_mib": ("float", False, "the memory CUDA reports (torch total_memory) in MiB"),
    "memory_type": ("str", True, "e.g. 'HBM3'"),
    "memory_bandwidth_gbs": ("float", True, "a positive bandwidth in GB/s (1e9 bytes/s)"),
    "l2_mb": ("float", False, "a positive L2 size in MB"),
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


def read_toml(path: Path, what: str) -> dict[str, Any]:
    """A TOML file's table; a missing or malformed file is a usage error naming ``what``."""
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise UsageError(f"{what} {str(path)!r} does not exist") from None
    except tomllib.TOMLDecodeError as err:
        raise UsageError(f"{what} {str(path)!r} is not valid TOML: {err}") from None


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
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise _bad(origin, field, expected, value)
        return value
    # positive float
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise _bad(origin, field, expected, value)
    return float(value)


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
    """How a file is named in error messages."""
    return f"GPU file {str(path)!r}"
