"""The transfer bench: copy-time model, crossovers, and the CPU-only run."""

from __future__ import annotations

import pytest
import torch

from nnperf.hardware import default_profile, load_gpu
from nnperf.measure.transfer import crossover, run_transfer_bench


def test_crossover_needs_every_larger_size_faster():
    sizes = [1, 2, 3, 4]
    cpu = [1.0, 2.0, 3.0, 4.0]
    assert crossover(sizes, cpu, [2.0, 1.0, 4.0, 1.0]) == 4  # 3 is slower again
    assert crossover(sizes, cpu, [2.0, 1.0, 1.0, 1.0]) == 2
    assert crossover(sizes, cpu, [5.0, 5.0, 5.0, 5.0]) is None
    assert crossover(sizes, cpu, [None, None, None, None]) is None


def test_cpu_only_run_predicts_the_gpu_columns():
    gpu = load_gpu("h100")
    prof = default_profile(gpu)
    result = run_transfer_bench([16, 48], gpu=gpu, cuda=None, repeats=2)
    assert "no CUDA GPU" in result["note"]
    for row in result["rows"]:
        assert row["cpu_s"] > 0 and row["gpu_resident_s"] is None and row["gpu_with_copies_s"] is None
        n = row["n"]
        extra = row["predicted_gpu_with_copies_s"] - row["predicted_gpu_resident_s"]
        # three copies of n*n fp32 plus the host dispatch of the three copies
        assert extra == pytest.approx(3 * (10e-6 + n * n * 4 / 63e9) + 3 * prof.host_dispatch_s)
    assert result["crossover"]["measured_resident"] is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_columns_measured_on_cuda():
    result = run_transfer_bench([64, 256], gpu=load_gpu("h100"), cuda=torch.device("cuda"), repeats=3)
    for row in result["rows"]:
        assert row["gpu_resident_s"] > 0 and row["gpu_with_copies_s"] > row["gpu_resident_s"]
