"""Peak tensor memory of a real step on the CPU, from the CPU allocator's own reports.

The process's resident set is a poor witness: it includes Python, the libraries, freed pages
the C allocator keeps, and it moves in pages. PyTorch's CPU allocator, while the profiler
records memory, reports every tensor allocation and free with its exact size; their running
sum over one step, added to the bytes of the tensors alive when the step starts, is the peak
of tensor memory during the step: the quantity nnperf's lifetime replay predicts
(``nnperf.passes.memory.host``). Library scratch memory that bypasses PyTorch's allocator
(oneDNN's, OpenMP's) is not in it, and is not in the prediction either.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

METHOD = "cpu-allocator-events"  # the profiler's memory events of the CPU allocator


def live_tensor_bytes(tensors: Iterable[Any]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views and ties counted once)."""
    sizes: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            storage = t.untyped_storage()
            sizes[storage.data_ptr()] = storage.nbytes()
    return sum(sizes.values())


def peak_allocation_growth(run: Callable[[], None]) -> int:
    """Highest running sum of CPU allocations minus frees during one call of ``run``."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    changes: list[tuple[int, int]] = []
    pending = list(reversed(prof.profiler.kineto_results.experimental_event_tree()))
    while pending:  # depth first, in recorded order, so equal timestamps keep their order
        node = pending.pop()
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            changes.append((node.start_time_ns, node.extra_fields.alloc_size))
        pending.extend(reversed(node.children))
    changes.sort(key=lambda c: c[0])
    running = peak = 0
    for _, nbytes in changes:
        running += nbytes
        peak = max(peak, running)
    return peak


def peak_tensor_bytes(run: Callable[[], None], state: Callable[[], list[Any]]) -> int:
    """Peak bytes of live tensors during one call of ``run`` (after the caller's warm-up).

    ``state`` lists the tensors alive before the step; it is called just before it, so
    lazily created state (optimizer moments after the first step) is included.
    """
    before = live_tensor_bytes(state())
    return before + peak_allocation_growth(run)
