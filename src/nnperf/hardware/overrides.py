"""What-if edits of a GPU entry (``--set KEY=VALUE``), applied to the raw table before validation.

Keys are the dotted names of the GPU file schema (``sm_count``, ``memory_bandwidth_gbs``,
``host_link.gbs_per_direction``, ``peak_tflops.tensor.bf16`` ...) plus one shortcut:
``peak_tflops.<dtype>`` sets that dtype on every unit that computes it. For ``fp32`` that means
CUDA cores, fp32 matrix units (AMD) and TF32 tensor cores alike, so ``peak_tflops.fp32=120``
makes any fp32 work run at 120 TFLOP/s whatever the TF32 setting (the background's worked
example "a GPU of 120 TFLOP/s"). A dtype no unit has is added to the tensor units.
"""

from __future__ import annotations

import copy
from typing import Any

from nnperf.errors import UsageError, shown
from nnperf.hardware import schema


def parse_set_values(values: list[str] | tuple[str, ...]) -> dict[str, str]:
    """Turn repeated ``KEY=VALUE`` strings into a dict, rejecting a missing '='."""
    out: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(
                f"--set {shown(item)} is not KEY=VALUE (e.g. --set memory_bandwidth_gbs=2000)"
            )
        if key.strip() in out:
            raise UsageError(f"--set {key.strip()} is given twice ({shown(out[key.strip()])} and "
                             f"{shown(value.strip())}); give each key once")
        out[key.strip()] = value.strip()
    return out


def _valid_keys_text() -> str:
    return ", ".join([*schema.valid_keys(), *(f"peak_tflops.{d}" for d in schema.RATE_KEYS)])


def _unknown(key: str) -> UsageError:
    return UsageError(f"--set: unknown key {shown(key)}; valid keys: {_valid_keys_text()}")


def _convert(key: str, kind: str, text: str, expected: str) -> Any:
    value: Any = text
    try:
        if kind == "int":
            value = int(text)
        elif kind == "float":
            value = float(text)
        elif kind == "strlist":
            value = [v.strip() for v in text.split(",") if v.strip()]
    except ValueError:
        valid = f", {schema.range_of(key).describe()}" if kind in ("int", "float") else ""
        raise UsageError(f"--set {key}={shown(text)}: expected {expected}{valid}") from None
    if kind in ("int", "float"):
        valid = schema.range_of(key)
        if not valid.admits(value):
            raise UsageError(f"--set {key}={shown(text)}: expected {expected}, {valid.describe()}")
        return value
    try:
        schema._check("--set", key, kind, value, expected)
    except UsageError:
        raise UsageError(f"--set {key}={text!r}: expected {expected}") from None
    return value


def apply_overrides(raw: dict[str, Any], overrides: dict[str, str]) -> dict[str, Any]:
    """Return a copy of a raw GPU table with the what-if values set."""
    out = copy.deepcopy(raw)
    for key, text in overrides.items():
        parts = key.split(".")
        if len(parts) == 1 and key in schema.SCALAR_FIELDS and key != "id":
            kind, _, expected = schema.SCALAR_FIELDS[key]
            out[key] = _convert(key, kind, text, expected)
        elif len(parts) == 2 and parts[0] == "host_link" and parts[1] in schema.HOST_LINK_FIELDS:
            kind, _, expected = schema.HOST_LINK_FIELDS[parts[1]]
            out.setdefault("host_link", {})[parts[1]] = _convert(key, kind, text, expected)
        elif len(parts) == 3 and parts[0] == "peak_tflops" and parts[1] in schema.UNITS:
            if parts[2] not in schema.RATE_KEYS:
                raise _unknown(key)
            value = _convert(key, "float", text, "a positive dense TFLOP/s")
            out.setdefault("peak_tflops", {}).setdefault(parts[1], {})[parts[2]] = value
        elif len(parts) == 2 and parts[0] == "peak_tflops" and parts[1] in schema.RATE_KEYS:
            value = _convert(key, "float", text, "a positive dense TFLOP/s")
            _set_everywhere(out.setdefault("peak_tflops", {}), parts[1], value)
        else:
            raise _unknown(key)
    return out


def _set_everywhere(peaks: dict[str, dict[str, float]], dtype: str, value: float) -> None:
    """Set ``dtype`` on every unit that computes it (fp32 includes TF32 tensor cores)."""
    targets = [(u, d) for u in schema.UNITS for d in (dtype,) if d in peaks.get(u, {})]
    if dtype == "fp32" and "tf32" in peaks.get("tensor", {}):
        targets.append(("tensor", "tf32"))
    if not targets:
        targets = [("cuda", dtype)] if dtype == "fp32" else [("tensor", dtype)]
    for unit, d in targets:
        peaks.setdefault(unit, {})[d] = value
