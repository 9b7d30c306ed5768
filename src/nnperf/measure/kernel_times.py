"""Device time per profiler op, each kernel of the profiled step counted once.

PyTorch's ``FunctionEvent.device_time_total`` sums the device events linked to an op and its
children's sums. On the H200 run (2026-11-28) that sum read more device time than the step
had in 3 of 52 runs: llama-7b inference's layers 19-31 twice layers 0-18, the MoE optimizers
4,586 and 424 ms inside 176 and 107 ms steps. Whatever the profiler delivered there (a kernel
record twice, a record from outside the profiled step, an annotation's GPU span, which
``_parse_kineto_results`` links like a kernel), time that cannot have run inside the step is
not the step's. So the attribution starts from the device events themselves:

* only kernels, copies and memsets count: a GPU user annotation (``record_function``'s span
  over the kernels it encloses: the optimizer's ``Optimizer.step#AdamW.step``,
  ``ProfilerStep#N``) and a CUDA synchronization interval are time already counted or no
  device work at all;
* a device event seen twice (same device, stream, start, end and name) counts once;
* a kernel that starts outside the profiled step (the ``ProfilerStep#N`` range; the step ends
  with a synchronize inside it, so every kernel it launched starts inside it) is dropped;
* each kept kernel goes to the one CPU op that launched it (its linked correlation id), the
  op that started last before the kernel if several events carry that id; a kernel no op of
  the step claims stays unattributed (``unlinked_s``), never spread.

What was dropped is kept by reason (count and seconds), so a record says how far PyTorch's
own sums would have been off. ``busy_s`` is the union of the kept kernels' intervals: the
device's busy time in the step, which attributed time can never exceed.

Where the profiler's events carry no ``linked_correlation_id`` (older PyTorch), the ops' own
kernel lists (``FunctionEvent.kernels``, PyTorch's links: not deduplicated) are used and
``method`` says so.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

#: kineto's activity types (``libkineto::toString(ActivityType)``) that are device work.
DEVICE_WORK = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
#: kineto's names for CUDA synchronization intervals on the device track (CUPTI's
#: CUpti_ActivitySynchronizationType), for events that carry no activity type.
SYNC_NAMES = frozenset({"Event Sync", "Stream Sync", "Stream Wait Event", "Context Sync"})

DEDUPLICATED = "kernels-deduplicated"
TORCH_LINKS = "torch-kernel-links"


def is_cpu(ev: Any) -> bool:
    """A host event (an op, an annotation, a runtime call), not a device track's."""
    return str(getattr(ev, "device_type", "DeviceType.CPU")).endswith("CPU")


def _seconds(us: float) -> float:
    return float(us) * 1e-6


@dataclass
class KernelTimes:
    """Device seconds each CPU op launched itself, and what the step's device did overall."""

    own_s: dict[int, float] = field(default_factory=dict)  # id(CPU event) -> seconds
    busy_s: float = 0.0
    unlinked_s: float = 0.0
    kept: int = 0
    dropped: dict[str, int] = field(default_factory=dict)  # reason -> device events
    dropped_s: dict[str, float] = field(default_factory=dict)  # reason -> seconds
    method: str = DEDUPLICATED
    _inclusive: dict[int, float] = field(default_factory=dict, repr=False)

    def inclusive_s(self, ev: Any) -> float:
        """The op's device time: the kernels it launched and those of every op below it."""
        key = id(ev)
        if key not in self._inclusive:
            self._inclusive[key] = self.own_s.get(key, 0.0) + sum(self.inclusive_s(c) for c in ev.cpu_children)
        return self._inclusive[key]

    def drop(self, reason: str, seconds: float) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1
        self.dropped_s[reason] = self.dropped_s.get(reason, 0.0) + seconds

    def to_json(self) -> dict[str, Any]:
        return {"method": self.method, "device_busy_s": self.busy_s, "unlinked_kernel_s": self.unlinked_s,
                "kept_device_events": self.kept, "dropped_device_events": dict(self.dropped),
                "dropped_device_s": dict(self.dropped_s)}

    @classmethod
    def of(cls, events: Sequence[Any]) -> KernelTimes:
        """From every event of one profiled step (``prof.events()``: host and device)."""
        cpu = [e for e in events if is_cpu(e)]
        device = [e for e in events if not is_cpu(e)]
        if device and not all(hasattr(e, "linked_correlation_id") for e in device):
            return cls._from_torch_links(cpu, device)
        out = cls()
        start, end = step_window(cpu)
        by_id: dict[int, list[Any]] = defaultdict(list)
        for ev in cpu:
            by_id[ev.id].append(ev)
        seen: set[tuple[Any, ...]] = set()
        intervals: list[tuple[float, float]] = []
        for ev in sorted(device, key=lambda e: e.time_range.start):
            t0, t1 = float(ev.time_range.start), float(ev.time_range.end)
            seconds = _seconds(t1 - t0)
            launchers = by_id.get(ev.linked_correlation_id, [])
            reason = _not_work(ev, launchers)
            if reason is None:
                key = (getattr(ev, "device_index", 0), getattr(ev, "device_resource_id", None), t0, t1, ev.name)
                if key in seen:
                    reason = "duplicate"
                else:
                    seen.add(key)
                    if not start <= t0 <= end:
                        reason = "outside the profiled step"
            if reason is not None:
                out.drop(reason, seconds)
                continue
            out.kept += 1
            intervals.append((t0, t1))
            launcher = _launcher(launchers, t0)
            if launcher is None:
                out.unlinked_s += seconds
            else:
                out.own_s[id(launcher)] = out.own_s.get(id(launcher), 0.0) + seconds
        out.busy_s = _seconds(union_length(intervals))
        return out

    @classmethod
    def _from_torch_links(cls, cpu: Sequence[Any], device: Sequence[Any]) -> KernelTimes:
        out = cls(method=TORCH_LINKS)
        for ev in cpu:
            own = sum(float(k.duration) for k in getattr(ev, "kernels", ()))
            if own:
                out.own_s[id(ev)] = _seconds(own)
        out.kept = len(device)
        out.busy_s = _seconds(union_length([(float(e.time_range.start), float(e.time_range.end)) for e in device]))
        return out


def _not_work(ev: Any, launchers: Sequence[Any]) -> str | None:
    """Why a device event is no kernel of its own, or None for a kernel, copy or memset."""
    kind = getattr(ev, "activity_type", None)
    if kind is not None and str(kind) not in DEVICE_WORK:
        return "annotation" if "annotation" in str(kind) else str(kind)
    if getattr(ev, "is_user_annotation", False) or any(c.name == ev.name for c in launchers):
        return "annotation"  # a record_function's span bears its annotation's name
    if ev.name in SYNC_NAMES:
        return "cuda_sync"
    return None


def _launcher(candidates: Sequence[Any], kernel_start: float) -> Any | None:
    """The CPU op that launched a kernel: of the events carrying its correlation id, an op
    (not a runtime call, whose own correlation ids come from CUPTI's counter) that started
    before the kernel, the latest such."""
    ops = [c for c in candidates if _is_op(c) and float(c.time_range.start) <= kernel_start]
    return max(ops, key=lambda c: float(c.time_range.start)) if ops else None


def _is_op(ev: Any) -> bool:
    kind = getattr(ev, "activity_type", None)
    if kind is not None:
        return str(kind) in ("cpu_op", "user_annotation")
    return _RUNTIME_CALL.match(ev.name) is None


#: CUDA runtime and driver calls (``cudaLaunchKernel``, ``cuLaunchKernelEx``).
_RUNTIME_CALL = re.compile(r"cu(da)?[A-Z]")


def step_window(cpu: Iterable[Any]) -> tuple[float, float]:
    """The profiled step's host range (microseconds): its ``ProfilerStep#N`` annotation, the
    last one if several; else the span of every host event."""
    cpu = list(cpu)
    steps = [e for e in cpu if e.name.startswith("ProfilerStep")]
    chosen = [max(steps, key=lambda e: float(e.time_range.start))] if steps else cpu
    if not chosen:
        return (0.0, 0.0)
    return (min(float(e.time_range.start) for e in chosen), max(float(e.time_range.end) for e in chosen))


def union_length(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length covered by ``intervals`` (overlaps, as on two streams, counted once)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total
