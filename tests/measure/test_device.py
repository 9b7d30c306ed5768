"""Device resolution, timing helpers and OOM detection."""

from __future__ import annotations

import pytest
import torch

from nnperf.errors import ResourceError, UsageError
from nnperf.measure.device import is_oom, resolve_device, time_batched, time_repeats


@pytest.mark.parametrize("bad", ["tpu", "gpu", "cpu:1", "cuda:x", ""])
def test_unknown_device_is_a_usage_error(bad):
    with pytest.raises(UsageError):
        resolve_device(bad)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_cuda_without_gpu_is_a_resource_error():
    with pytest.raises(ResourceError, match="no CUDA GPU"):
        resolve_device("cuda")
    assert resolve_device(None) == torch.device("cpu")


def test_time_repeats_runs_warmup_then_repeats():
    calls = []
    times = time_repeats(lambda: calls.append(1), torch.device("cpu"), warmup=2, repeats=4)
    assert len(calls) == 6 and len(times) == 4 and all(t >= 0 for t in times)


def test_time_batched_measures_a_sleep():
    import time

    times = time_batched(lambda: time.sleep(0.002), torch.device("cpu"), repeats=2, min_time_s=0.004)
    assert all(0.0019 < t < 0.05 for t in times)


def test_oom_detection():
    assert is_oom(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not is_oom(RuntimeError("shape mismatch"))
    assert not is_oom(ValueError("out of memory"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_events_time_a_known_sleep():
    dev = resolve_device("cuda")
    times = time_repeats(lambda: torch.cuda._sleep(int(1e7)), dev, warmup=1, repeats=3)
    assert all(t > 0 for t in times)
