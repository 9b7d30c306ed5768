"""Number formatting with labeled units: decimal for counts and rates, binary for memory."""

from __future__ import annotations

_DECIMAL = [(1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")]
_BINARY = [(2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")]


def si(value: float, unit: str = "", digits: int = 3) -> str:
    """1.23e9 -> '1.23 G' + unit. Used for FLOPs, MACs, FLOP/s, B/s and counts."""
    if value == 0:
        return f"0 {unit}".strip()
    shown = _rounded(value, digits)  # the prefix after rounding: 999,999 is '1 M', not '1e+03 k'
    for scale, prefix in _DECIMAL:
        if abs(shown) >= scale:
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


def _rounded(value: float, digits: int) -> float:
    """``value`` at ``digits`` significant digits, so the unit is chosen after rounding."""
    return float(f"{value:.{digits}g}")


def rate(value: float, unit: str) -> str:
    """A throughput: '4.67 k samples/s', '37.6 k tokens/s' (one format everywhere)."""
    return f"{si(value)} {unit}"


def seconds(value: float) -> str:
    """Durations from nanoseconds to seconds, always with a unit. Below a nanosecond (a
    scalar op's ideal compute time) digits would be noise: '<1 ns'."""
    if value == 0:
        return "0 s"
    if 0 < value < 1e-9:
        return "<1 ns"
    shown = _rounded(value, 3)  # the unit after rounding: 0.9996 ms is '1 ms', not '1e+03 µs'
    if shown >= 1:
        return f"{_significant(value, 3)} s"
    if shown >= 1e-3:
        return f"{value * 1e3:.3g} ms"
    if shown >= 1e-6:
        return f"{value * 1e6:.3g} µs"
    return f"{value * 1e9:.3g} ns"


def count(value: float) -> str:
    return f"{int(value):,}"
