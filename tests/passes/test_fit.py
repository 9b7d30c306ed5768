"""The largest-batch search: exact on synthetic peaks, honest when nothing fits."""

from __future__ import annotations

import math

from nnperf.passes.fit import largest_batch, not_fitting_message, what_ifs
from nnperf.passes.memory import MemoryReport
from nnperf.passes.memory.tracing import MemoryOptions
from nnperf.trace.capture import TraceOptions


def _measure(fn):
    def measure(batch: int) -> MemoryReport:
        total = fn(batch)
        return MemoryReport(source="predicted", model="toy", peak_allocated=total,
                            peak_reserved=total, device_total=total,
                            breakdown={"parameters": 100, "saved_activations": total - 100})
    return measure


def test_linear_peak_finds_the_exact_boundary_in_few_traces():
    # 1000 + 100 b <= 5050  <=>  b <= 40.5
    r = largest_batch(_measure(lambda b: 1000 + 100 * b), 5050)
    assert r.largest == 40
    assert len(r.probes) <= 5


def test_step_shaped_peak_matches_brute_force():
    def peak(b: int) -> int:
        return 3 * 2**20 + 2**20 * math.ceil(b * 37_000 / 2**20) + (b // 7) * 4096

    capacity = 700 * 2**20
    expected = max(b for b in range(1, 30_000) if peak(b) <= capacity)
    r = largest_batch(_measure(peak), capacity)
    assert r.largest == expected
    assert len(r.probes) <= 12


def test_nothing_fits_and_cap():
    assert largest_batch(_measure(lambda b: 1000 * b), 500).largest is None
    capped = largest_batch(_measure(lambda b: 10), 10**9, max_batch=64)
    assert (capped.largest, capped.capped) == (64, True)


def test_what_ifs_offer_the_memory_levers():
    labels = [label for label, _ in what_ifs(MemoryOptions(), None, blocks=True)]
    assert labels[0] == "as given"
    assert any("amp" in s for s in labels)
    assert any("checkpointing" in s for s in labels)
    assert any("sgd" in s for s in labels)
    assert labels[-1] == "all of the above"
    assert [s for s, _ in what_ifs(MemoryOptions(TraceOptions(train=False)), None, blocks=True)] == [
        "as given", "mixed precision (--amp bf16)"]


def test_what_ifs_change_the_trace_options_and_the_loop_settings():
    given = MemoryOptions(TraceOptions(optimizer_impl="fused"), grad_accum=2)
    combined = dict(what_ifs(given, None, blocks=True))["all of the above"]
    assert combined.trace == TraceOptions(optimizer="sgd", optimizer_impl="fused", amp="bf16")
    assert (combined.checkpoint, combined.grad_accum) == (True, 2)
    assert combined.trace_options().grads_persist  # accumulation: grads alive through forward
    assert not MemoryOptions(TraceOptions(train=False), grad_accum=2).trace_options().grads_persist


def test_not_fitting_message_says_what_batch_1_needs():
    class Gpu:
        name = "Toy GPU"
        memory_bytes = 2**30

    r = largest_batch(_measure(lambda b: 3 * 2**30 + b), 2**30, options=MemoryOptions())
    msg = not_fitting_message("toy", [r], Gpu())  # type: ignore[arg-type]
    assert "needs 3 GiB at batch 1" in msg
    assert "has 1 GiB" in msg
