"""The H100 SXM that torchtitan's Llama 3.1 benchmarks ran at a 500 W limit: its tensor peak is
derived from two datasheet entries of the same 132-SM chip (SXM at 700 W, NVL at 400 W), here
recomputed from the datasheet numbers themselves."""

from __future__ import annotations

import math

import pytest

from nnperf.hardware.catalog import load_gpu

SXM_BF16_SPARSE, SXM_WATTS = 1979, 700  # NVIDIA H100 datasheet, H100 SXM column
NVL_BF16_SPARSE, NVL_WATTS = 1671, 400  # H100 NVL column (350-400 W: the upper figure)
FLOP_PER_CLK_SM, SMS = 4096, 132  # Hopper dense fp16/bf16 per SM per clock


def test_500w_tensor_clock_follows_the_two_datasheet_power_limits():
    sxm_mhz = SXM_BF16_SPARSE / 2 * 1e12 / (SMS * FLOP_PER_CLK_SM) / 1e6  # ~1830
    nvl_mhz = NVL_BF16_SPARSE / 2 * 1e12 / (SMS * FLOP_PER_CLK_SM) / 1e6  # ~1545
    k = math.log(sxm_mhz / nvl_mhz) / math.log(SXM_WATTS / NVL_WATTS)
    assert k == pytest.approx(1 / 3, abs=0.04)  # dynamic power's cube law, nearly
    expected_mhz = nvl_mhz * (500 / NVL_WATTS) ** k
    g = load_gpu("h100-sxm-96gb-500w")
    assert g.tensor_clock_mhz == pytest.approx(expected_mhz, rel=2e-3)
    assert g.tensor_tflops["bf16"] * 1e12 == pytest.approx(SMS * FLOP_PER_CLK_SM * expected_mhz * 1e6, rel=2e-3)
    assert NVL_BF16_SPARSE / 2 < g.tensor_tflops["bf16"] < SXM_BF16_SPARSE / 2  # torchtitan: "between"


def test_500w_part_keeps_the_memory_torchtitan_states():
    g = load_gpu("h100-sxm-96gb-500w")
    assert (g.memory_gib, g.memory_bandwidth_gbs, g.memory_type) == (96, 2400, "HBM2e")
    assert g.tdp_w == 500 and g.confidence == "unverified"
