"""A measured run overlays a prediction only when it holds measurements of the predicted GPU."""

from __future__ import annotations

import pytest

from nnperf.errors import UsageError
from nnperf.hardware import load_gpu
from nnperf.report.html.measured import check_comparable, measured_from_json


def _measure_doc(device: str, device_name: str) -> dict:
    """The parts of 'nnperf measure --json' the overlay reads."""
    return {
        "totals": {"step_time_s": 0.5, "measured_step_time_s": 0.8, "measured_peak_memory_bytes": 1024},
        "measurement": {"device": device, "device_name": device_name},
        "modules": [{"name": "fc", "time_s": 0.1, "measured_time_s": 0.2}],
    }


def test_a_document_without_measured_values_is_refused():
    analyze_json = {"schema": "nnperf.analysis/1", "totals": {"flops": 10}, "modules": [{"name": "fc"}]}
    with pytest.raises(UsageError, match="holds no measured values"):
        measured_from_json(analyze_json, source="a.json")


def test_a_cpu_measurement_does_not_overlay_a_gpu_prediction():
    measured = measured_from_json(_measure_doc("cpu", "AMD EPYC"), source="m.json")
    assert measured.step_time_s == 0.8  # the measured value, not the prediction beside it
    with pytest.raises(UsageError, match="measured on the CPU"):
        check_comparable(measured, [load_gpu("h100")])


def test_another_gpu_is_refused_and_the_same_gpu_by_its_driver_name_is_accepted():
    measured = measured_from_json(_measure_doc("cuda:0", "NVIDIA H100 80GB HBM3"), source="m.json")
    check_comparable(measured, [load_gpu("h100")])
    check_comparable(measured, [load_gpu("a100-40gb"), load_gpu("h100")])  # one of several
    with pytest.raises(UsageError, match="predicts A100"):
        check_comparable(measured, [load_gpu("a100-40gb")])
