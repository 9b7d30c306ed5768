"""Device profiles: generic defaults as data, per-architecture refinements, measured curves."""

from __future__ import annotations

import math

import pytest

from nnperf.errors import UsageError
from nnperf.hardware import default_profile, load_gpu, load_profile, save_profile
from nnperf.hardware.profile import interpolate


def test_defaults_come_from_the_data_file():
    p = default_profile()
    assert 0.75 <= p.gemm_peak_fraction <= 0.85
    assert 0.8 <= p.bandwidth_fraction <= 0.92
    assert 2e-6 <= p.kernel_overhead_s <= 5e-6
    assert 5e-6 <= p.host_dispatch_s <= 20e-6
    assert p.tiles()[0] in {(256, 128), (128, 256)} and p.tiles()[-1] == (64, 64)


def test_architecture_refinement():
    hopper, ampere = default_profile(load_gpu("h100")), default_profile(load_gpu("a100"))
    assert hopper.attention_forward_fraction < ampere.attention_forward_fraction  # [architecture.hopper]
    assert default_profile(load_gpu("mi300x")).gemm_peak_fraction != ampere.gemm_peak_fraction  # cdna3
    assert default_profile(load_gpu("v100")).alignment_penalty["16B"] == 0.25
    assert default_profile(load_gpu("v100")).alignment_penalty["128B"] == 0.95  # merged


def test_interpolation_is_linear_in_log_x():
    curve = [(1e3, 1.0), (1e5, 3.0)]
    assert interpolate(curve, 1e4) == pytest.approx(2.0)  # halfway in log10
    assert interpolate(curve, 10**3.5) == pytest.approx(1.5)
    assert interpolate(curve, 1.0) == 1.0 and interpolate(curve, 1e9) == 3.0


def test_bandwidth_size_dependence_and_curve_override():
    p = default_profile()
    peak = 1e12
    half = p.bandwidth_half_bytes
    assert p.achievable_bandwidth(peak, half) == pytest.approx(peak * p.bandwidth_fraction / 2)
    measured = p.replace(bandwidth_curve=((1e3, 1e9), (1e9, 9e11)))
    assert measured.achievable_bandwidth(peak, 1e6) == pytest.approx(1e9 + 0.5 * (9e11 - 1e9))


def test_save_and_load_round_trip(tmp_path):
    gpu = load_gpu("h200")
    p = default_profile(gpu).replace(
        gemm_peak_fraction=0.77,
        bandwidth_curve=((4096.0, 1e9), (2.0**30, 4.3e12)),
        gemm_efficiency={"bf16": ((1e9, 0.3), (1e12, 0.78))},
        note='measured "today"',
    )
    path = tmp_path / "h200.toml"
    save_profile(p, path)
    assert load_profile(path, gpu) == p
    assert math.isclose(load_profile(path, gpu).math_fraction("tensor", "bf16", 1e12), 0.78)


def test_partial_profile_keeps_defaults_and_bad_fields_fail(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text("kernel_overhead_s = 4e-6\n")
    p = load_profile(path)
    assert (
        p.kernel_overhead_s == 4e-6 and p.gemm_peak_fraction == default_profile().gemm_peak_fraction
    )
    path.write_text("gemm_peak_fraction = -1\n")
    with pytest.raises(UsageError, match=r"p.toml.*gemm_peak_fraction"):
        load_profile(path)
    path.write_text("gemm_peak_fractoin = 0.7\n")
    with pytest.raises(UsageError, match="unknown field 'gemm_peak_fractoin'"):
        load_profile(path)
