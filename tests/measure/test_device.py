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


class _FakeAllocator:
    """The caching allocator's peak statistics as CUDA keeps them: a reset sets each peak to
    what is held now; emptying the cache returns the unused reserve."""

    def __init__(self) -> None:
        self.allocated = self.reserved = self.peak_allocated = self.peak_reserved = 0

    def alloc(self, n: int) -> None:
        self.allocated += n
        self.reserved = max(self.reserved, self.allocated)
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def free(self, n: int) -> None:
        self.allocated -= n

    def empty_cache(self) -> None:
        self.reserved = self.allocated

    def reset_peak_memory_stats(self, device=None) -> None:
        self.peak_allocated, self.peak_reserved = self.allocated, self.reserved


def test_both_peaks_are_read_before_freeing_resets_them(monkeypatch):
    from nnperf.measure.device import cuda_peaks, free_memory

    fake = _FakeAllocator()
    for name in ("empty_cache", "reset_peak_memory_stats"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: fake.peak_allocated)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: fake.peak_reserved)
    cuda = torch.device("cuda")
    fake.alloc(100)  # weights, held across steps
    fake.reset_peak_memory_stats()
    for _ in range(2):  # two steps: 300 bytes of activations each, freed at the step's end
        fake.alloc(300)
        fake.free(300)
    peaks = cuda_peaks(cuda)
    assert (peaks.allocated_bytes, peaks.reserved_bytes) == (400, 400)
    free_memory(cuda)  # the runner frees after the run: empty_cache, then reset
    # read here, as the first run did, the reserved "peak" is what is held after emptying
    assert torch.cuda.max_memory_reserved(cuda) == 100 < peaks.allocated_bytes
