"""The host-device copy model of ``kernels.transfer``."""

from __future__ import annotations

import pytest

from nnperf.hardware import load_gpu
from nnperf.kernels.transfer import copy_time


def test_copy_time_from_the_host_link():
    gpu = load_gpu("h100")  # PCIe 5.0 x16: 63 GB/s per direction in the catalog
    nbytes = 200 * 200 * 4
    assert copy_time(nbytes, gpu) == pytest.approx(10e-6 + 160_000 / 63e9)
