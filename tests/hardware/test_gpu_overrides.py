"""What-if overrides (--set KEY=VALUE) of a catalog GPU."""

from __future__ import annotations

import pytest

from nnperf.errors import UsageError
from nnperf.hardware import load_gpu
from nnperf.hardware.overrides import parse_set_values


def test_one_set_makes_fp32_compute_run_at_120_tflops():
    # The background's worked example: "a GPU of 120 TFLOP/s" for fp32 work.
    for name in ("h100", "v100", "mi300x"):
        g = load_gpu(name, overrides={"peak_tflops.fp32": "120"})
        assert g.matmul_peak("fp32").flops == 120e12, name
        assert g.matmul_peak("fp32", tf32=True).flops == 120e12, name
        assert g.overrides == ("peak_tflops.fp32=120",)


def test_scalar_dotted_and_unit_keys():
    g = load_gpu(
        "h100",
        overrides={
            "memory_bandwidth_gbs": "2000",
            "sm_count": "100",
            "peak_tflops.tensor.bf16": "500",
            "host_link.gbs_per_direction": "32",
        },
    )
    assert g.memory_bandwidth == 2000e9 and g.sm_count == 100
    assert g.peak_flops("bf16") == 500e12
    assert g.host_link.gbs_per_direction == 32
    assert load_gpu("h100").sm_count == 132  # the catalog itself is untouched


def test_adding_units_a_gpu_lacks():
    g = load_gpu("v100", overrides={"peak_tflops.bf16": "125"})
    assert g.math_unit("bf16") == "tensor" and g.peak_flops("bf16") == 125e12


@pytest.mark.parametrize(
    "key,value,match",
    [
        ("sm_cout", "100", r"unknown key 'sm_cout'; valid keys: name, .*sm_count"),
        ("peak_tflops.tensor.bf17", "1", "unknown key"),
        ("sm_count", "many", r"sm_count='many': expected a positive"),
        ("sm_count", "-3", "expected a positive"),
        ("memory_bandwidth_gbs", "0", "expected a positive"),
    ],
)
def test_bad_overrides(key, value, match):
    with pytest.raises(UsageError, match=match):
        load_gpu("h100", overrides={key: value})


def test_parse_set_values():
    assert parse_set_values(["a=1", " b = x "]) == {"a": "1", "b": "x"}
    with pytest.raises(UsageError, match="KEY=VALUE"):
        parse_set_values(["sm_count"])
