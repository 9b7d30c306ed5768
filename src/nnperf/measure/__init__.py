"""Measurement on real hardware: steps, microbenchmarks (calibration), the transfer bench and
the validation harness's error table. Everything runs on the CPU; CUDA paths are used when a
GPU is present."""

from __future__ import annotations

from nnperf.measure.device import resolve_device
from nnperf.measure.runner import Measurement, combined_json, measure
from nnperf.measure.stats import Spread, percentile
from nnperf.measure.validation import error_table

__all__ = ["Measurement", "Spread", "combined_json", "error_table", "measure", "percentile", "resolve_device"]
