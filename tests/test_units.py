"""Unit formatting: binary sizes and durations keep a unit and never switch to exponents."""

from __future__ import annotations

from nnperf.units import binary, rate, seconds, si


def test_binary_sizes():
    assert binary(512) == "512 B"
    assert binary(1536) == "1.5 KiB"
    assert binary(1020 * 2**20) == "1020 MiB"  # not 1.02e+03 MiB
    assert binary(3 * 2**30) == "3 GiB"


def test_durations():
    assert seconds(2.5e-6) == "2.5 µs"
    assert seconds(0.0123) == "12.3 ms"
    assert seconds(1234.0) == "1234 s"  # not 1.23e+03 s


def test_below_a_nanosecond_and_zero():
    assert seconds(1.19e-13) == "<1 ns"  # a scalar op's ideal compute time, not '0.000119 ns'
    assert seconds(0.0) == "0 s"
    assert seconds(3.2e-9) == "3.2 ns"


def test_the_prefix_is_chosen_after_rounding():
    assert si(999_999) == "1 M"  # not '1e+03 k'
    assert seconds(0.0009996) == "1 ms"  # not '1e+03 µs'


def test_one_throughput_format():
    assert rate(37_640, "tokens/s") == "37.6 k tokens/s"
    assert rate(4_673, "samples/s") == "4.67 k samples/s"
