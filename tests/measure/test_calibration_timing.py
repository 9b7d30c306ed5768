"""How a calibration's timing method reaches its profile: raw files whose short kernels read as
the host's launch time (``TIMING_HOST_EXPOSED``) keep only the rows above that floor."""

from __future__ import annotations

import dataclasses
import json

import pytest

from nnperf.hardware import default_profile, load_gpu
from nnperf.kernels.gemm import estimate_gemm
from nnperf.measure.calibration import Calibration
from nnperf.measure.calibration.profile import HOST_FLOOR_MARGIN, build_profile
from nnperf.measure.calibration.record import TIMING_DEVICE, TIMING_HOST_EXPOSED


def _cal(timing: str) -> Calibration:
    return Calibration(device="cuda:0", device_name="NVIDIA H200", quick=False, date="d", torch_version="t",
                       threads=1, timing=timing, complete=True)


def _gemm(n: int, seconds: float) -> dict:
    flops = 2.0 * n**3
    return {"dtype": "bf16", "kind": "square", "m": n, "n": n, "k": n, "flops": flops, "time_s": seconds,
            "flops_per_s": flops / seconds}


def _copy(nbytes: int, seconds: float) -> dict:
    return {"kind": "copy", "bytes_moved": nbytes, "time_s": seconds, "bytes_per_s": nbytes / seconds}


# the H200 of 2026-11-28 (validation/data/h200-sxm/profile.json): every GEMM up to 1024^3 read
# ~12.2 us, the host's cost of one mm (13.4 us); 2048^3 and up were the device's
GEMMS = [_gemm(512, 12.2e-6), _gemm(1024, 12.3e-6), _gemm(2048, 24.5e-6), _gemm(4096, 174.7e-6)]
COPIES = [_copy(2**17, 6.6e-6), _copy(2**21, 6.9e-6), _copy(2**27, 35.3e-6), _copy(2**31, 520.8e-6)]


def test_a_host_exposed_calibration_keeps_only_what_timed_the_device():
    gpu = load_gpu("h200-sxm")
    peak = 989.4e12  # bursts run at the boost clock: fractions of the datasheet peak
    cal = _cal(TIMING_HOST_EXPOSED)
    cal.gemm, cal.bandwidth = list(GEMMS), list(COPIES)
    cal.overhead["host_per_op_by_kind_s"] = {"mm": {"median": 13.4e-6}}
    profile = build_profile(cal, gpu)
    # floor: max(12.2 us fastest, 13.4 us host mm) x 1.6 = 21.4 us: 2048^3 and 4096^3 stay
    assert HOST_FLOOR_MARGIN == 1.6
    assert [f for f, _ in profile.gemm_efficiency["bf16"]] == [2.0 * 2048**3, 2.0 * 4096**3]
    assert profile.gemm_efficiency["bf16"][0][1] == pytest.approx(2.0 * 2048**3 / 24.5e-6 / peak)
    # a 512^3 GEMM now takes 2048^3's fraction of peak, not the host's 22 TFLOP/s
    assert profile.math_fraction("tensor", "bf16", 2.0 * 512**3) == pytest.approx(2.0 * 2048**3 / 24.5e-6 / peak)
    # copies: floor 6.6 us x 1.6 = 10.6 us; the two small ones take the default ramp instead:
    # 0.88 of the datasheet bandwidth x n / (n + 2 MiB)
    big = gpu.memory_bandwidth * 0.88
    expected = [(2**17, big * 2**17 / (2**17 + 2**21)), (2**21, big / 2), (2**27, 2**27 / 35.3e-6),
                (2**31, 2**31 / 520.8e-6)]
    assert [n for n, _ in profile.bandwidth_curve] == [n for n, _ in expected]
    assert [r for _, r in profile.bandwidth_curve] == pytest.approx([r for _, r in expected])


def test_a_device_timed_calibration_keeps_every_row():
    gpu = load_gpu("h200-sxm")
    cal = _cal(TIMING_DEVICE)
    cal.gemm, cal.bandwidth = list(GEMMS), list(COPIES)
    profile = build_profile(cal, gpu)
    assert len(profile.gemm_efficiency["bf16"]) == 4
    assert list(profile.bandwidth_curve) == [(c["bytes_moved"], c["bytes_per_s"]) for c in COPIES]


def test_raw_files_read_back_with_their_timing():
    cal = _cal(TIMING_DEVICE)
    cal.gemm = list(GEMMS)
    again = Calibration.from_json(json.loads(json.dumps(cal.to_json())))
    assert again == cal
    older = cal.to_json()
    del older["timing"]  # raw files from before device-only timing
    assert Calibration.from_json(older).timing == TIMING_HOST_EXPOSED
    with pytest.raises(ValueError, match="not an nnperf calibration"):
        Calibration.from_json({"schema": "something else"})


def test_channels_last_convolutions_scale_the_table_against_their_implicit_gemm():
    """The table's meaning: a convolution against the GEMM of its implicit shape (its compute
    term, the one the time model divides by the class's efficiency). A dense channels_last 3x3
    convolution measured at half the speed that implies gives a scale of 0.5 (a burst, at the
    datasheet clock: the sustained one is the prediction's)."""
    gpu = dataclasses.replace(load_gpu("h200-sxm"), sustained_clock_mhz=None)
    base = default_profile(gpu)
    batch, cin, hw, cout = 32, 64, 56, 64
    gemm = estimate_gemm(batch * hw * hw, cout, cin * 9, dtype="bf16", gpu=gpu, profile=base)
    table = base.conv_efficiency_of(1, hw * hw, "forward", "tensor")
    cal = _cal(TIMING_DEVICE)
    cal.conv_variants = [{"kind": "dense", "dtype": "bf16", "layout": "channels_last", "tf32": False,
                          "batch": batch, "in_channels": cin, "hw": hw, "out_channels": cout, "kernel": 3,
                          "stride": 1, "groups": 1, "time_s": gemm.model_compute_s / (0.5 * table)},
                         {"kind": "dense", "dtype": "bf16", "layout": "nchw", "tf32": False,  # not used:
                          "batch": batch, "in_channels": cin, "hw": hw, "out_channels": cout,  # transposes
                          "kernel": 3, "stride": 1, "groups": 1, "time_s": 1.0}]             # are apart
    assert build_profile(cal, gpu).conv_efficiency_scale == pytest.approx(0.5)
