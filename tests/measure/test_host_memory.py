"""Peak tensor memory of real CPU work from the CPU allocator's reports, checked against
allocations whose sizes are known by construction."""

from __future__ import annotations

import torch

from nnperf.measure.host_memory import live_tensor_bytes, peak_allocation_growth


def test_peak_growth_is_the_high_water_mark_of_allocations_minus_frees():
    def work():
        a = torch.empty(1000)  # 4,000 B
        b = torch.empty(2000, dtype=torch.float64)  # 16,000 B
        del a
        c = torch.empty(250)  # 1,000 B: below the earlier high-water mark
        del b, c

    assert peak_allocation_growth(work) == 4_000 + 16_000


def test_peak_growth_counts_only_what_the_work_allocates():
    kept = torch.empty(10_000)  # allocated before: not growth

    def work():
        kept.mul_(kept)  # in place: no allocation (tensor operands: no wrapped scalars)
        t = kept + kept  # 40,000 B
        del t

    assert peak_allocation_growth(work) == 40_000


def test_live_bytes_count_each_storage_once():
    base = torch.empty(100)
    view = base[10:20]
    other = torch.empty(7, dtype=torch.int64)
    assert live_tensor_bytes([base, view, base, other, None, 3]) == 400 + 56
