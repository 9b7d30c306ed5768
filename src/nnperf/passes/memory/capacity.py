"""Does a step fit in a GPU's memory: the one decision every command prints.

``nnperf memory``, ``fit``, ``predict``, ``compare`` and the HTML report all answer it from
the memory model's device total with this rule: the
allocator's segments, the CUDA context and the workspaces are resident at the same time, so
the whole total has to be at most the GPU's memory. Keeping the rule in one function keeps
a report from calling "fits" what ``fit`` says does not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def fits(device_total: float, capacity: float) -> bool:
    """Whether a predicted device total (bytes) fits in ``capacity`` bytes of GPU memory."""
    return device_total <= capacity


def capacity(gpu: Any) -> int:
    """The bytes a step is checked against on ``gpu``: the memory CUDA reports to a process
    (``GPU.usable_memory_bytes``: the nominal size less what the driver keeps), not the
    datasheet's size, which no process gets: 80 GiB H100s report 79.2 GiB."""
    return int(gpu.usable_memory_bytes)


def verdict(fitting: bool) -> str:
    """The words tables print: a step that does not fit is the thing a reader must not miss."""
    return "fits" if fitting else "DOES NOT FIT"


@dataclass(frozen=True)
class MemoryFit:
    """A step's predicted device total against one GPU's memory."""

    device_total: int  # bytes: allocator segments + CUDA context + workspaces (memory model)
    capacity: int  # bytes of the GPU's memory

    @classmethod
    def on(cls, device_total: float, gpu: Any) -> MemoryFit:
        """``device_total`` bytes against ``gpu``'s ``capacity``."""
        return cls(int(device_total), capacity(gpu))

    @property
    def fits(self) -> bool:
        return fits(self.device_total, self.capacity)

    @property
    def share(self) -> float:
        """Device total as a fraction of the GPU's memory (above 1: does not fit)."""
        return self.device_total / self.capacity if self.capacity else float("inf")

    @property
    def verdict(self) -> str:
        return verdict(self.fits)

    def to_json(self) -> dict[str, Any]:
        return {
            "device_total_bytes": self.device_total,
            "gpu_memory_bytes": self.capacity,
            "fits_in_memory": self.fits,
        }
