"""Number formatting with labeled units: decimal for counts and rates, binary for memory."""

from __future__ import annotations

_DECIMAL = [(1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")]
_BINARY = [(2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")]


def si(value: float, unit: str = "", digits: int = 3) -> str:
    """1.23e9 -> '1.23 G' + unit. Used for FLOPs, MACs, FLOP/s, B/s and counts."""
    if value == 0:
        return f"0 {unit}".strip()
    for scale, prefix in _DECIMAL:
        if abs(value) >= scale:
            return f"{value / scale:.{digits}g} {prefix}{unit}"
    return f"{value:.{digits}g} {unit}".strip()


def binary(nbytes: float, digits: int = 3) -> str:
    """Memory sizes in KiB/MiB/GiB, as PyTorch reports them."""
    for scale, unit in _BINARY:
        if abs(nbytes) >= scale:
            return f"{_significant(nbytes / scale, digits)} {unit}"
    return f"{nbytes:.0f} B"


def _significant(value: float, digits: int) -> str:
    """``digits`` significant digits, but never exponent notation (1020 MiB, not 1.02e+03)."""
    return f"{value:.{digits}g}" if abs(value) < 10**digits else f"{value:.0f}"


def seconds(value: float) -> str:
    """Durations from nanoseconds to seconds, always with a unit."""
    if value >= 1:
        return f"{_significant(value, 3)} s"
    if value >= 1e-3:
        return f"{value * 1e3:.3g} ms"
    if value >= 1e-6:
        return f"{value * 1e6:.3g} µs"
    return f"{value * 1e9:.3g} ns"


def count(value: float) -> str:
    return f"{int(value):,}"
