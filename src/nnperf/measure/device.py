"""Which device to measure on, and how to time work on it without fooling ourselves.

Rules every timing in ``nnperf.measure`` follows:

* warm-up runs first (lazy initialisation, allocator growth, cuBLAS heuristics, CPU caches);
* on CUDA the clock is a pair of CUDA events around the work, read after a synchronize, so
  the figure is device time between the two points and not the host's enqueue time;
* on the CPU the clock is ``time.perf_counter``;
* every figure is the median of several repeats (see ``stats.Spread``);
* inputs are random, never zeros (zero operands can take fast paths and flatter a kernel).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from nnperf.errors import ResourceError, UsageError

DEVICES = ("cpu", "cuda")


def resolve_device(name: str | None) -> torch.device:
    """``"cpu"``, ``"cuda"`` or ``"cuda:N"`` as a torch device; None means CUDA if present.

    An unknown string is a usage error; CUDA asked for on a machine without it is a resource
    error (exit code 5), so scripts can tell "you typed it wrong" from "not on this machine".
    """
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    text = name.strip().lower()
    kind, _, index = text.partition(":")
    if kind not in DEVICES or (index and (kind != "cuda" or not index.isdigit())):
        raise UsageError(f"unknown device {name!r}; valid: cpu, cuda, cuda:N")
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise ResourceError(
                "--device cuda was asked for but no CUDA GPU is available on this machine "
                "(torch.cuda.is_available() is False); use --device cpu"
            )
        if index and int(index) >= torch.cuda.device_count():
            raise ResourceError(
                f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)"
            )
        return torch.device(text)
    return torch.device("cpu")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_repeats(
    fn: Callable[[], object],
    device: torch.device,
    *,
    warmup: int = 3,
    repeats: int = 10,
    sync_each: bool = True,
) -> list[float]:
    """Seconds per call of ``fn`` for each of ``repeats`` calls, after ``warmup`` calls.

    CUDA: events recorded around each call after a synchronize, so each figure covers the
    call's whole device timeline starting from an idle device (host launch latency included,
    as in a training loop step). CPU: ``perf_counter`` around each call.
    """
    for _ in range(warmup):
        fn()
    synchronize(device)
    times: list[float] = []
    if device.type == "cuda":
        pairs = []
        for _ in range(repeats):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            if sync_each:
                torch.cuda.synchronize(device)
            start.record()
            fn()
            end.record()
            pairs.append((start, end))
        torch.cuda.synchronize(device)
        times = [s.elapsed_time(e) / 1e3 for s, e in pairs]  # elapsed_time is in ms
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return times


def time_back_to_back(fn: Callable[[], object], device: torch.device, steps: int) -> float:
    """Seconds per call of ``steps`` calls run back to back, timed with the host's clock and
    one synchronize at the end, as a training loop runs them: the host issues a step while the
    device still runs the previous one, so a host-bound step shows its host time here, where
    ``time_repeats`` (a synchronize before each call) shows host and device time in series."""
    synchronize(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    synchronize(device)
    return (time.perf_counter() - t0) / steps


@dataclass(frozen=True)
class CudaPeaks:
    """The caching allocator's peaks since its statistics were last reset."""

    allocated_bytes: int
    reserved_bytes: int


def cuda_peaks(device: torch.device) -> CudaPeaks:
    """Both peaks of the steps just run, read together before anything resets them
    (``free_memory`` does: the H200 run of 2026-11-28 read the reserved peak after it and
    recorded what the allocator held after emptying its cache, below the allocated peak in
    50 of 52 runs)."""
    return CudaPeaks(int(torch.cuda.max_memory_allocated(device)), int(torch.cuda.max_memory_reserved(device)))


def time_batched(
    fn: Callable[[], object],
    device: torch.device,
    *,
    warmup: int = 2,
    repeats: int = 5,
    min_time_s: float = 2e-3,
    device_only: bool = False,
) -> list[float]:
    """Seconds per call for fast work: each repeat runs ``fn`` enough times to last
    ``min_time_s`` (clock resolution and event overhead then disappear in the average).

    ``device_only`` (CUDA): the kernels' own time, not the host's. A kernel shorter than its
    launch leaves the device waiting on the host, and events around a loop of them time the
    host's launch rate instead (on the H200 of 2026-11-28 every GEMM up to 1024^3 read 12 us,
    the host's cost of one ``mm``). So each repeat first holds the device in ``_sleep`` while
    the host enqueues the whole loop, and the events time the queued kernels back to back,
    as they run in a device-bound step. The loop stays well inside the launch queue (1024
    pending kernels), which the host would otherwise have to wait on."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    t0 = time.perf_counter()
    fn()
    synchronize(device)
    once = max(time.perf_counter() - t0, 1e-7)
    queued = device_only and device.type == "cuda"
    inner = max(1, min(_QUEUED_CALLS if queued else 10_000, int(min_time_s / once)))

    def many() -> None:
        for _ in range(inner):
            fn()

    if not queued:
        return [t / inner for t in time_repeats(many, device, warmup=0, repeats=repeats)]
    # ``once`` (a call and a synchronize) bounds the host's enqueue time per call from above;
    # twice that at 2 GHz, the most a Hopper SM clocks, sleeps at least that long
    return time_queued(many, inner, device, repeats, sleep_cycles=int(min(0.5, 2 * inner * once) * 2e9))


def time_queued(loop: Callable[[], None], n: int, device: torch.device, repeats: int,
                sleep_cycles: int = int(2e8)) -> list[float]:
    """Device seconds per call of a ``loop`` of ``n`` calls: the device is held in ``_sleep``
    (``sleep_cycles``, ~0.1 s at 2 GHz by default) while the host enqueues the whole loop, so
    the events between time only the queued kernels, back to back."""
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(sleep_cycles)
        start.record()
        loop()
        end.record()
        torch.cuda.synchronize(device)
        times.append(start.elapsed_time(end) / 1e3 / n)
    return times


#: Calls of one device-only timing loop: each may launch a few kernels, and all of them must
#: fit the launch queue while the device sleeps.
_QUEUED_CALLS = 200


# ---- memory ---------------------------------------------------------------------------------
def is_oom(err: BaseException) -> bool:
    """True for CUDA (or CPU allocator) out-of-memory errors, whatever class raised them."""
    oom_cls = getattr(torch.cuda, "OutOfMemoryError", None)
    if oom_cls is not None and isinstance(err, oom_cls):
        return True
    return isinstance(err, RuntimeError) and "out of memory" in str(err).lower()


def free_memory(device: torch.device) -> None:
    """Drop what a failed run left behind so the process stays usable after an OOM."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_name()


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo (Linux), else platform.processor()."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "CPU"
