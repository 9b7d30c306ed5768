"""Sustained clocks: a GPU whose measured clock under load is published has its peaks scaled
from the clock the datasheet quotes them at; the measurement must be named."""

from __future__ import annotations

import pytest

from nnperf.errors import UsageError
from nnperf.hardware import list_gpus, load_gpu


def test_peaks_scale_from_the_quoted_clock():
    g = load_gpu("rtx-4090")
    assert g.sustained_clock_mhz == 2810 and g.tensor_clock_mhz == 2520
    assert g.peak_flops("fp16") == pytest.approx(165.2e12 * 2810 / 2520)  # Ada whitepaper 165.2 at 2520 MHz
    assert g.peak_flops("fp32", tensor_cores=False) == pytest.approx(82.6e12 * 2810 / 2520)
    a100 = load_gpu("a100-80gb-sxm")  # no sustained clock in its entry: the datasheet peak
    assert a100.sustained_clock_mhz is None and a100.peak_flops("bf16") == pytest.approx(312e12, rel=1e-3)


def test_every_catalog_sustained_clock_names_its_measurement():
    for g in list_gpus():
        if g.sustained_clock_mhz:
            assert g.sources.get("sustained_clock"), g.id
            assert "sustained_clock_mhz" in g.unverified or "GEMM" in g.sources["sustained_clock"], g.id


def test_a_gpu_file_needs_the_source_a_what_if_does_not(tmp_path):
    path = tmp_path / "slow-t4.toml"
    path.write_text("\n".join([
        'name = "T4 at its power limit"', 'vendor = "NVIDIA"', 'architecture = "Turing"', "sm_count = 40",
        "boost_clock_mhz = 1590", "memory_gib = 16", 'memory_type = "GDDR6"', "memory_bandwidth_gbs = 320",
        "sustained_clock_mhz = 1200", "[peak_tflops.tensor]", "fp16 = 65", "[peak_tflops.cuda]", "fp32 = 8.1"]))
    with pytest.raises(UsageError, match=r"sustained_clock_mhz needs its measurement named in \[sources\]"):
        load_gpu(None, gpu_file=path)
    what_if = load_gpu("t4", overrides={"sustained_clock_mhz": "1200"})
    assert what_if.peak_flops("fp16") == pytest.approx(65e12 * 1200 / 1590)


def test_mi300x_runs_gemms_at_amds_measured_clock():
    g = load_gpu("mi300x")  # AMD: bf16 GEMM at a median 1207 MHz against the 2100 MHz peak clock
    assert g.peak_flops("bf16") == pytest.approx(1307.4e12 * 1207 / 2100)


def test_b200_runs_a_long_load_at_the_clock_flashinfer_measured():
    g = load_gpu("b200")  # flashinfer PR #2899: 1965 -> ~1580 MHz at ~1000 W; bf16 2250 TF at 1856 MHz
    assert g.peak_flops("bf16") == pytest.approx(2250e12 * 1580 / 1856)
    assert g.peak_flops("fp32", tensor_cores=False) == pytest.approx(75e12 * 1580 / 1980)


def test_a_peak_the_user_sets_is_the_rate_itself_not_scaled_by_the_clock():
    g = load_gpu("rtx-4090", overrides={"peak_tflops.tensor.fp16": "100"})
    assert g.peak_flops("fp16") == pytest.approx(100e12)
    assert g.peak_flops("bf16") == pytest.approx(165.2e12 * 2810 / 2520)  # not set: still scaled
