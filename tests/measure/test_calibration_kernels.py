"""The kernel constants a calibration derives from its convolution variants: depthwise tap
rates, cuDNN's layout-conversion rate, the low-channel (RGB stem) class."""

from __future__ import annotations

import pytest

from nnperf.hardware import default_profile, load_gpu
from nnperf.kernels.gemm import estimate_gemm
from nnperf.measure.calibration import Calibration
from nnperf.measure.calibration.profile import (
    build_profile,
    depthwise_rates,
    layout_transpose_rate,
    low_channel_efficiency,
)
from nnperf.measure.calibration.record import TIMING_DEVICE
from nnperf.passes.timing import transpose_time

H200 = load_gpu("h200-sxm")
PER_SECOND = 132 * 1980e6  # SMs x boost clock


def _cal() -> Calibration:
    return Calibration(device="cuda:0", device_name="NVIDIA H200", quick=False, date="d", torch_version="t",
                       threads=1, timing=TIMING_DEVICE, complete=True)


def _variant(kind, dtype, layout, time_s, cin=64, cout=64, hw=56, kernel=3, groups=1, tf32=False, batch=32):
    return {"kind": kind, "dtype": dtype, "layout": layout, "tf32": tf32, "batch": batch, "in_channels": cin,
            "hw": hw, "out_channels": cout, "kernel": kernel, "stride": 1, "groups": groups, "time_s": time_s}


def _flat(curve):
    return [v for point in curve for v in point]


def test_depthwise_rates_per_family_and_kernel_area():
    cal = _cal()
    macs3 = 32 * 144 * 56 * 56 * 9  # output elements x taps
    macs7 = 32 * 96 * 56 * 56 * 49
    cal.conv_variants = [
        _variant("depthwise", "bf16", "nchw", macs3 / (3.0 * PER_SECOND), cin=144, cout=144, groups=144),
        _variant("depthwise", "bf16", "nchw", macs7 / (5.0 * PER_SECOND), cin=96, cout=96, kernel=7, groups=96),
        _variant("depthwise", "bf16", "channels_last", macs3 / (12.0 * PER_SECOND), cin=144, cout=144, groups=144),
        _variant("depthwise", "fp32", "nchw", macs3 / (2.5 * PER_SECOND), cin=144, cout=144, groups=144, tf32=True),
        _variant("dense", "bf16", "nchw", 1e-4),  # not depthwise: left out
    ]
    rates = depthwise_rates(cal, H200)
    assert set(rates) == {"native_bf16", "cudnn_bf16", "native_fp32"}
    assert _flat(rates["native_bf16"]) == pytest.approx([9.0, 3.0, 49.0, 5.0])
    assert _flat(rates["cudnn_bf16"]) == pytest.approx([9.0, 12.0])
    assert _flat(rates["native_fp32"]) == pytest.approx([9.0, 2.5])
    profile = build_profile(cal, H200)  # measured families replace the default, others stay
    assert _flat(profile.depthwise_rate["native_bf16"]) == pytest.approx([9.0, 3.0, 49.0, 5.0])
    assert profile.depthwise_rate["cudnn_fp32"] == default_profile(H200).depthwise_rate["cudnn_fp32"]


def test_layout_transpose_rate_from_nchw_and_channels_last_pairs():
    cal = _cal()
    act, filt = 32 * 64 * 56 * 56 * 2, 64 * 64 * 9 * 2  # bf16 input and filter
    extra = 2 * (act + filt) / (4.0 * PER_SECOND)  # converted at 4 bytes per SM and clock
    cal.conv_variants = [_variant("dense", "bf16", "channels_last", 25e-6),
                         _variant("dense", "bf16", "nchw", 25e-6 + extra),
                         _variant("dense", "fp32", "nchw", 1.0, tf32=False),  # CUDA cores: no pair used
                         _variant("dense", "fp32", "channels_last", 2e-5, tf32=False)]
    assert layout_transpose_rate(cal, H200) == pytest.approx(4.0)
    assert build_profile(cal, H200).layout_transpose_bytes_per_clock_sm == pytest.approx(4.0)
    cal.conv_variants = cal.conv_variants[:1]  # no pair: nothing to derive
    assert layout_transpose_rate(cal, H200) is None


def test_low_channel_efficiency_is_the_stems_share_of_its_implicit_gemm():
    profile = default_profile(H200)
    gemm = estimate_gemm(32 * 112 * 112, 64, 3 * 49, dtype="bf16", gpu=H200, profile=profile)
    moved = 2 * 2 * (32 * 3 * 224 * 224 + 64 * 3 * 49)  # input and filter, read and written
    around = transpose_time(moved, H200, profile) + 3 * profile.kernel_overhead_s
    cal = _cal()
    # a stem whose own kernel ran at a quarter of the GEMM model's compute rate
    cal.conv = [{"dtype": "bf16", "batch": 32, "in_channels": 3, "hw": 224, "out_channels": 64, "kernel": 7,
                 "stride": 2, "time_s": around + gemm.model_compute_s / 0.25},
                {"dtype": "bf16", "batch": 32, "in_channels": 64, "hw": 56, "out_channels": 64, "kernel": 3,
                 "stride": 1, "time_s": 5e-5}]  # 128 channel bytes: not a low-channel pass
    assert low_channel_efficiency(cal, H200, profile) == pytest.approx(0.25)
    assert low_channel_efficiency(cal, H200, profile.replace(conv_efficiency_scale=0.5)) == pytest.approx(0.5)


def test_a_low_channel_class_left_out_falls_back_to_the_stride_class():
    a100 = default_profile(load_gpu("a100-80gb-sxm"))  # not measured off Hopper
    assert "low_channel_forward" not in a100.conv_efficiency
    assert a100.conv_efficiency_of(2, 112 * 112, "forward", "tensor", 6) == a100.conv_efficiency_of(
        2, 112 * 112, "forward", "tensor")
    h100 = default_profile(load_gpu("h100-sxm"))
    assert h100.conv_efficiency_of(2, 112 * 112, "forward", "tensor", 6) == pytest.approx(0.157)
    assert h100.conv_efficiency_of(2, 112 * 112, "forward", "tensor", 16) == pytest.approx(0.88)  # a full vector


def test_burst_gemms_are_fractions_of_the_datasheet_peak_not_the_sustained_one():
    """The calibration's GEMMs are short bursts at the boost clock: their rates are read against
    the datasheet peak, and a prediction applies the H200's sustained clock (1470 of 1830 MHz)
    on top, so a GEMM measured at 780 TFLOP/s comes back at 780 x 1470/1830."""
    cal = _cal()
    n = 8192
    cal.gemm = [{"kind": "square", "dtype": "bf16", "m": n, "n": n, "k": n, "flops": 2.0 * n**3,
                 "flops_per_s": 780e12, "time_s": 2.0 * n**3 / 780e12}]
    profile = build_profile(cal, H200)
    ((_, fraction),) = profile.gemm_efficiency["bf16"]
    assert fraction == pytest.approx(780e12 / 989.4e12, rel=1e-3)  # the whitepaper's dense bf16 rate
    assert H200.matmul_peak("bf16").flops == pytest.approx(989.4e12 * 1470 / 1830, rel=1e-3)
