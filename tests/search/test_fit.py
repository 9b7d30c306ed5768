"""The largest-batch search: what brute force over traces returns, in few traces; exact on
synthetic peaks; honest when nothing fits."""

from __future__ import annotations

import functools
import gc
import itertools
import math
import os
import sys
from collections.abc import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nnperf.errors import UsageError
from nnperf.hardware import load_gpu
from nnperf.passes.memory import MemoryReport, predict_memory
from nnperf.passes.memory.model import allocation_program
from nnperf.request import ModelRequest
from nnperf.search import fit_parallel
from nnperf.search.fit import (
    FitResult,
    Sample,
    fit,
    largest_batch,
    not_fitting_message,
    trace_measure,
    what_ifs,
)
from nnperf.search.fit_parallel import run_searches, search_workers
from nnperf.search.fit_replay import BatchModel, Footprint
from nnperf.search.memory_variants import MemoryOptions, trace_memory
from nnperf.trace.options import TraceOptions


def _measure(fn):
    def measure(batch: int) -> Sample:
        total = fn(batch)
        return Sample(MemoryReport(source="predicted", model="toy", peak_allocated=total,
                                   peak_reserved=total, device_total=total,
                                   breakdown={"parameters": 100, "saved_activations": total - 100}))
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


def test_what_ifs_keep_the_users_optimizer_before_switching_it():
    """Mixed precision, checkpointing and both come before SGD, which changes the training
    (issue 39: fit suggested SGD for Llama-3.1-8B and never fused AdamW with checkpointing)."""
    given = MemoryOptions(TraceOptions(optimizer_impl="fused"))
    found = what_ifs(given, None, blocks=True)
    assert [label for label, _ in found] == [
        "as given", "mixed precision (--amp bf16)", "activation checkpointing per block",
        "mixed precision and checkpointing, adamw (fused) kept", "--optimizer sgd (no state)", "all of the above"]
    both = dict(found)["mixed precision and checkpointing, adamw (fused) kept"]
    assert (both.trace.optimizer, both.trace.optimizer_impl, both.trace.amp, both.checkpoint) == (
        "adamw", "fused", "bf16", True)
    # amp given (Llama-3.1-8B's run): checkpointing with the optimizer kept, then SGD
    amp_given = what_ifs(MemoryOptions(TraceOptions(amp="bf16", optimizer_impl="fused")), None, blocks=True)
    assert [label for label, _ in amp_given] == [
        "as given", "activation checkpointing per block", "--optimizer sgd (no state)", "all of the above"]


def test_not_fitting_message_suggests_the_first_what_if_that_fits():
    class Gpu:
        name = "Toy GPU"
        memory_bytes = usable_memory_bytes = 2**30

    per_sample = {"as given": 3 * 2**30, "activation checkpointing per block": 2**28,
                  "--optimizer sgd (no state)": 2**26}
    results = [largest_batch(_measure(lambda b, n=n: per_sample[n] * b), 2**30, label=n, options=MemoryOptions())
               for n in per_sample]
    msg = not_fitting_message("toy", results, Gpu())  # type: ignore[arg-type]
    assert msg.endswith("; try activation checkpointing per block, which fits batch 4 "
                        "(--optimizer sgd (no state) fits batch 16)")


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
        usable_memory_bytes = 2**30

    r = largest_batch(_measure(lambda b: 3 * 2**30 + b), 2**30, options=MemoryOptions())
    msg = not_fitting_message("toy", [r], Gpu())  # type: ignore[arg-type]
    assert "needs 3 GiB at batch 1" in msg
    assert "has 1 GiB usable" in msg


# -- the search over real traces --------------------------------------------------------------

class _Block(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.fc = nn.Linear(d, 2 * d)
        self.out = nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.out(F.gelu(self.fc(x)))


class _Net(nn.Module):
    """Blocks over (batch, 64 tokens, 256): activations of 64 KiB per sample and block cross
    the allocator's pool and segment sizes at small batches, so the peak is not monotone."""

    def __init__(self, special_batch_1: bool = False):
        super().__init__()
        self.blocks = nn.Sequential(*[_Block(256) for _ in range(3)])
        self.special_batch_1 = special_batch_1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.special_batch_1 and x.shape[0] == 1:
            x = x * 1.0  # one more op at batch 1: not the same step as at other batches
        return self.blocks(x)


@functools.cache
def _traced(options: MemoryOptions, special_batch_1: bool = False) -> Callable[[int], Sample]:
    """Trace _Net at a batch (once per batch and configuration: tests search many capacities)."""
    cache: dict[int, Sample] = {}

    def measure(batch: int) -> Sample:
        if batch not in cache:
            request = ModelRequest(_Net(special_batch_1), inputs=(torch.randn(batch, 64, 256),))
            cache[batch] = trace_measure(request, options, architecture="ampere")(batch)
        return cache[batch]

    return measure


def _capacities(totals: dict[int, int]) -> list[int]:
    """Every capacity at which the answer changes: each total, one byte below it, and beyond."""
    values = sorted(set(totals.values()))
    return [values[0] - 1, *[c for v in values for c in (v - 1, v)], values[-1] + 1]


def _check_against_brute_force(measure: Callable[[int], Sample], n: int, start: int = 1) -> list[FitResult]:
    totals = {b: measure(b).total for b in range(1, n + 1)}
    results = []
    for capacity in _capacities(totals):
        expected = max((b for b, t in totals.items() if t <= capacity), default=None)
        r = largest_batch(measure, capacity, max_batch=n, start=start)
        assert r.largest == expected, (capacity, [p.batch for p in r.probes])
        assert r.capped == (expected == n)
        assert r.at_largest is (measure(expected).report if expected else None)
        assert r.at_one is measure(min(p.batch for p in r.probes)).report
        assert r.probes[0].batch == start  # the first trace is the batch the caller has
        assert r.exhaustive  # every batch above the answer ruled out, not only the next
        results.append(r)
    return results


def test_fast_search_returns_what_brute_force_over_traces_returns():
    measure = _traced(MemoryOptions(checkpoint=True))
    n = 24
    results = _check_against_brute_force(measure, n)
    # meaningful: somewhere a batch fits above one that does not (peaks are not monotone)
    totals = [measure(b).total for b in range(1, n + 1)]
    assert any(later < earlier for earlier, later in itertools.pairwise(totals))
    # and few traces: batch 1, the first guess, the answer and the batch after it
    assert max(len(r.probes) for r in results if r.largest and not r.capped) <= 5
    assert sum(len(r.probes) for r in results) / len(results) <= 4


def test_a_search_from_another_batch_returns_what_brute_force_returns():
    # advise starts at the batch as given (it has that trace): batch 1 only when it does not fit
    measure = _traced(MemoryOptions(checkpoint=True))
    below = 0
    for start in (2, 7, 24):
        results = _check_against_brute_force(measure, 24, start=start)
        below += sum(1 for r in results if r.largest and r.largest < start)
    assert below  # answers below the start were searched too


def test_a_step_that_changes_with_the_batch_is_still_searched_exactly():
    # batch 1 runs one more op: it cannot be interpolated with the others
    measure = _traced(MemoryOptions(), special_batch_1=True)
    assert not measure(1).footprint.matches(measure(2).footprint)
    assert measure(2).footprint.matches(measure(3).footprint)
    _check_against_brute_force(measure, 20)


def test_replaying_interpolated_traces_gives_the_traced_totals():
    measure = _traced(MemoryOptions())
    model = BatchModel.between(measure(2).footprint, measure(9).footprint)
    for batch in (3, 5, 16, 23):
        assert model.total(batch) == measure(batch).total
        assert model.lower_bound(batch) <= measure(batch).total


def test_a_scan_over_budget_settles_for_a_boundary_the_same_way_every_time():
    measure = _traced(MemoryOptions(checkpoint=True))
    model = BatchModel.between(measure(2).footprint, measure(9).footprint)
    capacity = measure(10).total
    exact, exhaustive = model.largest(capacity, 1000)
    limit = model.limit(capacity, 1000)  # no batch above it fits (a monotone bound)
    assert exhaustive and exact == max(b for b in range(1, limit + 1) if measure(b).total <= capacity)
    cut = [model.largest(capacity, 1000, max_requests=0) for _ in range(2)]
    assert cut[0] == cut[1] and not cut[0][1]  # a budget in requests, not seconds
    boundary = cut[0][0]
    assert model.fits(boundary, capacity) and boundary <= exact


def test_the_requested_bytes_bound_does_not_overflow():
    def footprint(batch: int, each: int) -> Footprint:
        sizes = np.array([each, each, each, each], dtype=np.int64)
        return Footprint(batch, (True, True, False, False), (1, 2, 1, 2), (0, 0, 0, 0), sizes,
                         np.ones(4, dtype=bool), np.zeros(0, dtype=np.int64), 0, 2)

    model = BatchModel.between(footprint(1, 2**42), footprint(2, 2**43))
    assert model.lower_bound(2**20) == 2**63  # two live requests of 2**62: beyond int64
    assert model.lower_bound(3) == 2 * 3 * 2**42


def test_allocation_program_peaks_are_the_replay_peaks():
    request = ModelRequest(_Net(), inputs=(torch.randn(3, 64, 256),))
    _, trace, _ = trace_memory(request, MemoryOptions(checkpoint=True))
    program = allocation_program(trace)
    report = predict_memory(trace, program=program)
    assert program.peaks() == (report.peak_allocated, report.peak_reserved)
    assert report.to_json() == predict_memory(trace).to_json()


# -- searches in processes --------------------------------------------------------------------

def _tiny_gpt2_fit(workers: int) -> list[dict]:
    request = ModelRequest("gpt2", seq_len=64, overrides={"n_layer": 2, "n_embd": 64, "n_head": 2,
                                                          "vocab": 512, "n_positions": 64})
    gpu = load_gpu("a100-40gb", overrides={"memory_gib": "1"})
    options = MemoryOptions(TraceOptions(optimizer="sgd", amp="bf16"))
    found = fit(request, gpu, options, workers=workers)
    return [{k: v for k, v in r.to_json().items() if k != "seconds"} for r in found]


def test_searches_in_processes_give_what_searches_here_give():
    # the searches here run backwards first: on a CUDA build of PyTorch (even without a GPU)
    # that starts autograd's device threads, after which a forked worker cannot run autograd
    here = _tiny_gpt2_fit(1)
    assert [r["what_if"] for r in here] == ["as given", "activation checkpointing per block"]
    assert _tiny_gpt2_fit(2) == here
    assert gc.get_freeze_count() == 0  # frozen for the forked workers only: collectable here again


def test_searches_in_fork_server_workers_give_what_searches_here_give(monkeypatch):
    # the way taken after autograd's threads started (CUDA builds), taken here on any build
    here = _tiny_gpt2_fit(1)
    started: list[str] = []
    real_context = fit_parallel._context
    monkeypatch.setattr(fit_parallel, "start_method", lambda: "forkserver")
    monkeypatch.setattr(fit_parallel, "_context",
                        lambda method: started.append(method) or real_context(method))
    assert _tiny_gpt2_fit(2) == here
    # started early by fit (prepare), then the workers' context: no fork
    assert started == ["forkserver", "forkserver"]


def _child_can_run_a_backward() -> bool:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            x = torch.ones(3, requires_grad=True)
            (x * 2).sum().backward()
            code = 0 if x.grad is not None and x.grad.tolist() == [2.0, 2.0, 2.0] else 2
        except RuntimeError:
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    assert code in (0, 1), f"the forked child failed otherwise (exit {code})"
    return code == 0


@pytest.mark.skipif(sys.platform != "linux", reason="the searches fork on Linux only")
def test_fork_is_safe_says_whether_a_forked_child_can_run_autograd():
    # what the tracer does: a backward of fake tensors with a cast (on CUDA builds of PyTorch
    # this starts autograd's per-device threads; on CPU builds it starts none)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        w = torch.ones(4, requires_grad=True)
        (w.to(torch.bfloat16) * 2).sum().backward()
    assert fit_parallel.fork_is_safe() == _child_can_run_a_backward()
    assert fit_parallel.start_method() == ("fork" if fit_parallel.fork_is_safe() else "forkserver")


def _jobs(*labels: str) -> list[tuple[str, MemoryOptions]]:
    return [(label, MemoryOptions(checkpoint=label == "c")) for label in labels]


def test_run_searches_keeps_the_order_and_raises_a_searchs_own_error():
    assert run_searches(lambda label, _: label, _jobs("a", "b", "c"), 2) == ["a", "b", "c"]

    def failing(label: str, _: MemoryOptions) -> str:
        if label == "b":
            raise UsageError("bad b")
        return label

    with pytest.raises(UsageError, match="bad b"):
        run_searches(failing, _jobs("a", "b", "c"), 2)

    class Local(Exception):  # a local class: its instances cannot travel back from a worker
        pass

    def failing_locally(label: str, _: MemoryOptions) -> str:
        if label == "b":
            raise Local("b failed")
        return label

    with pytest.raises(Local, match="b failed"):
        run_searches(failing_locally, _jobs("a", "b"), 2)

    # a search that cannot be pickled to fork-server workers runs here
    assert run_searches(lambda label, _: label, _jobs("a", "b"), 2, method="forkserver") == ["a", "b"]


def test_search_workers_fork_only_where_it_is_safe(monkeypatch):
    monkeypatch.delenv("NNPERF_FIT_WORKERS", raising=False)
    assert search_workers(MemoryOptions(), 1) == 1
    assert search_workers(MemoryOptions(TraceOptions(real=True)), 5) == 1
    monkeypatch.setenv("NNPERF_FIT_WORKERS", "1")
    assert search_workers(MemoryOptions(), 5) == 1
    monkeypatch.setenv("NNPERF_FIT_WORKERS", "3")
    assert search_workers(MemoryOptions(), 5) == (3 if sys.platform == "linux" else 1)


@pytest.mark.skipif(sys.platform != "linux", reason="the searches fork on Linux only")
def test_the_fork_servers_warm_up_leaves_its_children_able_to_run_autograd():
    import subprocess

    code = (
        "import os, torch, nnperf.search.fit_server\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    x = torch.ones(2, requires_grad=True); (3 * x).sum().backward()\n"
        "    os._exit(0 if x.grad.tolist() == [3.0, 3.0] else 2)\n"
        "print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.split()[-1] == "0", out.stderr[-2000:]
