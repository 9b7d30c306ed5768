"""Each kernel of the profiled step counted once, to the op that launched it: synthetic profiler
events built by hand (the failure modes the H200 run's attribution showed), and a real CPU
profile."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import torch
from torch.autograd import DeviceType

from nnperf.measure.align import UNLINKED_KERNELS, align, flatten_profile
from nnperf.measure.kernel_times import (
    DEDUPLICATED,
    TORCH_LINKS,
    KernelTimes,
    step_window,
    union_length,
)


@dataclass
class _Range:
    start: float
    end: float


@dataclass(eq=False)
class _Ev:
    """The FunctionEvent attributes the attribution reads (times in microseconds)."""

    name: str
    id: int
    start: float
    end: float
    device_type: DeviceType = DeviceType.CPU
    activity_type: str | None = "cpu_op"
    linked_correlation_id: int = 0
    device_resource_id: int = 7  # the stream
    is_user_annotation: bool = False
    cpu_children: list = field(default_factory=list)

    @property
    def time_range(self) -> _Range:
        return _Range(self.start, self.end)

    @property
    def cpu_time_total(self) -> float:
        return self.end - self.start


def _gpu(name: str, linked: int, start: float, end: float, kind: str | None = "kernel", **kw) -> _Ev:
    return _Ev(name, 10_000 + int(start), start, end, DeviceType.CUDA, kind, linked, **kw)


def _step() -> tuple[list[_Ev], dict[str, _Ev]]:
    """One profiled step, 0..1000 us: a linear layer and an optimizer's foreach op, with each
    way the profiler can offer time that is not the step's own kernels."""
    addmm = _Ev("aten::addmm", 3, 20, 90)
    runtime = _Ev("cudaLaunchKernel", 3, 25, 28, activity_type="cuda_runtime")  # CUPTI's own id 3
    addmm.cpu_children.append(runtime)
    linear = _Ev("aten::linear", 2, 10, 100, cpu_children=[addmm])
    foreach = _Ev("aten::_foreach_add_", 5, 210, 390)
    optimizer = _Ev("Optimizer.step#AdamW.step", 4, 200, 400, activity_type="user_annotation",
                    is_user_annotation=True, cpu_children=[foreach])
    step = _Ev("ProfilerStep*", 1, 0, 1000, activity_type="user_annotation", is_user_annotation=True,
               cpu_children=[linear, optimizer])
    device = [
        _gpu("gemm", 3, 30, 80),                       # addmm's kernel, 50 us
        _gpu("gemm", 3, 30, 80),                       # the same record delivered twice
        _gpu("gemm", 3, -500, -400),                   # a record from before the step, 100 us
        _gpu("ProfilerStep*", 1, 30, 900, "gpu_user_annotation"),  # the step's span
        _gpu("Optimizer.step#AdamW.step", 4, 220, 300, None),  # a span named like its annotation
        _gpu("multi_tensor_apply", 5, 220, 240),       # foreach kernels: 20 + 60 us
        _gpu("multi_tensor_apply", 5, 240, 300),
        _gpu("Context Sync", 0, 300, 600, None),       # the host waiting, no work
        _gpu("memcpy", 99, 500, 510, "gpu_memcpy"),    # 10 us no op of the step launched
    ]
    events = [step, linear, addmm, runtime, optimizer, foreach, *device]
    return events, {"step": step, "linear": linear, "addmm": addmm, "runtime": runtime,
                    "optimizer": optimizer, "foreach": foreach}


def test_each_kernel_once_to_the_op_that_launched_it():
    events, ev = _step()
    k = KernelTimes.of(events)
    assert k.method == DEDUPLICATED
    assert k.own_s == {id(ev["addmm"]): pytest.approx(50e-6), id(ev["foreach"]): pytest.approx(80e-6)}
    assert k.inclusive_s(ev["linear"]) == pytest.approx(50e-6)
    assert k.inclusive_s(ev["optimizer"]) == pytest.approx(80e-6)  # its span is not added again
    assert k.inclusive_s(ev["step"]) == pytest.approx(130e-6)
    assert k.unlinked_s == pytest.approx(10e-6)
    assert k.kept == 4
    assert k.dropped == {"duplicate": 1, "outside the profiled step": 1, "annotation": 2, "cuda_sync": 1}
    assert k.dropped_s["outside the profiled step"] == pytest.approx(100e-6)
    assert k.dropped_s["annotation"] == pytest.approx((870 + 80) * 1e-6)
    assert k.busy_s == pytest.approx((50 + 20 + 60 + 10) * 1e-6)  # union of the kept intervals


def test_attribution_never_exceeds_the_devices_busy_time():
    events, ev = _step()
    k = KernelTimes.of(events)
    ops = flatten_profile([ev["step"]], {"aten.addmm", "aten._foreach_add_"}, kernels=k)
    assert [(o.name, o.time_s) for o in ops] == [("aten.addmm", pytest.approx(50e-6)),
                                                 ("aten._foreach_add_", pytest.approx(80e-6))]
    a = align([(0, "aten.addmm"), (1, "aten._foreach_add_")], ops, k)
    assert a.matched_s == pytest.approx(130e-6)
    assert a.unmatched_s == pytest.approx(10e-6) and a.profiler_only == {UNLINKED_KERNELS: pytest.approx(10e-6)}
    assert a.matched_s + a.unmatched_s <= k.busy_s * (1 + 1e-12)
    assert a.to_json()["kernels"]["dropped_device_events"]["duplicate"] == 1


def test_without_links_the_ops_own_kernel_lists_are_used():
    @dataclass
    class _Kernel:
        duration: float

    op = _Ev("aten::mm", 1, 0, 50)
    op.kernels = [_Kernel(30.0), _Kernel(5.0)]  # type: ignore[attr-defined]
    # an older PyTorch's device event: no linked_correlation_id
    kernel = SimpleNamespace(name="gemm", device_type=DeviceType.CUDA, time_range=_Range(10, 40))
    k = KernelTimes.of([op, kernel])
    assert k.method == TORCH_LINKS and k.own_s == {id(op): pytest.approx(35e-6)}
    assert k.busy_s == pytest.approx(30e-6)


def test_union_and_window():
    assert union_length([(0, 10), (5, 15), (20, 25), (21, 22)]) == 20
    assert union_length([]) == 0
    a, b = _Ev("ProfilerStep*", 1, 100, 200), _Ev("ProfilerStep*", 2, 300, 450)
    assert step_window([a, b, _Ev("aten::mm", 3, 310, 320)]) == (300, 450)  # the last step
    assert step_window([_Ev("aten::mm", 3, 5, 9), _Ev("aten::add", 4, 2, 7)]) == (2, 9)


def test_real_cpu_profile_has_a_step_window_and_no_device_events():
    from torch.profiler import ProfilerActivity, profile, schedule

    model = torch.nn.Linear(8, 4)
    x = torch.randn(2, 8)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=1, repeat=1)) as prof:
        for _ in range(2):
            model(x).sum().backward()
            prof.step()
    events = list(prof.events())
    steps = [e for e in events if e.name.startswith("ProfilerStep")]
    start, end = step_window(events)
    assert steps and (start, end) == (steps[-1].time_range.start, steps[-1].time_range.end)
    assert all(start <= e.time_range.start <= end for e in events if e.name.startswith("aten::"))
    k = KernelTimes.of(events)
    assert k.kept == 0 and k.own_s == {} and k.busy_s == 0.0
