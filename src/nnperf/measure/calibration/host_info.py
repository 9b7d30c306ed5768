"""What calibrate records about the machine around the device: the host CPU's model and
maximum clock (dispatch costs scale with one core's speed) and the GPU's SM clock under a
sustained GEMM load (datasheet peaks assume the boost clock)."""

from __future__ import annotations

import platform
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

CPUINFO = Path("/proc/cpuinfo")
CPU_MAX_FREQ = Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")  # kHz


def cpu_model() -> str:
    """The CPU's model name (Linux /proc/cpuinfo; elsewhere what ``platform`` says)."""
    try:
        for line in CPUINFO.read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_max_ghz() -> float | None:
    """The maximum clock the kernel's cpufreq driver reports for core 0, None if unknown
    (virtual machines often do not expose it)."""
    try:
        return int(CPU_MAX_FREQ.read_text().strip()) / 1e6
    except (OSError, ValueError):
        return None


def sm_clock_mhz(index: int) -> float | None:
    """The current SM clock of GPU ``index``: NVML through torch, else nvidia-smi, else None."""
    import torch

    try:
        return float(torch.cuda.clock_rate(index))
    except Exception:  # pynvml missing or the query unsupported: try nvidia-smi
        pass
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "-i", str(index), "--query-gpu=clocks.sm", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
        return float(out.strip().splitlines()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def clock_under_load(work: Callable[[], object], sync: Callable[[], object], index: int,
                     seconds: float = 3.0) -> dict[str, Any]:
    """Sample the SM clock while ``work`` (large GEMMs) keeps the GPU busy for ``seconds``:
    median, min and max MHz over the samples; empty if no clock can be read."""
    samples = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(8):
            work()
        clock = sm_clock_mhz(index)
        if clock is None:
            return {}
        samples.append(clock)
    sync()
    if not samples:
        return {}
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples),
            "samples": len(samples), "seconds": seconds}
