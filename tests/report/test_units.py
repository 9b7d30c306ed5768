"""Unit formatting: binary sizes and durations keep a unit and never switch to exponents."""

from __future__ import annotations

from nnperf.report.units import binary, seconds


def test_binary_sizes():
    assert binary(512) == "512 B"
    assert binary(1536) == "1.5 KiB"
    assert binary(1020 * 2**20) == "1020 MiB"  # not 1.02e+03 MiB
    assert binary(3 * 2**30) == "3 GiB"


def test_durations():
    assert seconds(2.5e-6) == "2.5 µs"
    assert seconds(0.0123) == "12.3 ms"
    assert seconds(1234.0) == "1234 s"  # not 1.23e+03 s
