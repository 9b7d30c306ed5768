"""Aligning profiler op trees with the trace's ops, on synthetic profiler events."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from nnperf.measure.align import ProfiledOp, align, flatten_profile


@dataclass
class _Range:
    start: float


@dataclass
class _Ev:
    name: str
    cpu_time_total: float  # microseconds, like FunctionEvent
    start: float
    cpu_children: list = field(default_factory=list)
    device_time_total: float = 0.0

    @property
    def time_range(self):
        return _Range(self.start)


def test_flatten_keeps_outermost_known_op_and_leaf_aten_ops():
    roots = [
        _Ev("aten::linear", 100, 0, [_Ev("aten::t", 5, 1, [_Ev("aten::transpose", 3, 1)]),
                                     _Ev("aten::addmm", 90, 2, [_Ev("aten::copy_", 4, 3)])]),
        _Ev("autograd::engine::evaluate_function: AddmmBackward0", 70, 10,
            [_Ev("AddmmBackward0", 69, 10, [_Ev("aten::mm", 60, 11, [], 55.0)])]),
        _Ev("ProfilerStep#1", 1, -1, []),  # not an aten op: ignored
    ]
    ops = flatten_profile(roots, {"aten.addmm", "aten.mm", "aten.copy_"}, device_time=False)
    assert [(o.name, o.time_s) for o in ops] == [
        ("aten.transpose", pytest.approx(3e-6)),
        ("aten.addmm", pytest.approx(90e-6)),  # copy_ inside addmm is not emitted again
        ("aten.mm", pytest.approx(60e-6)),
    ]
    gpu = flatten_profile(roots, {"aten.mm"}, device_time=True)
    assert [o.time_s for o in gpu if o.name == "aten.mm"] == [pytest.approx(55e-6)]


def test_align_is_robust_to_extra_and_missing_ops():
    trace = [(0, "aten.addmm"), (1, "aten.relu"), (2, "aten.addmm"), (5, "aten.sum"), (7, "aten.mm")]
    prof = [ProfiledOp("aten.addmm", 1.0), ProfiledOp("aten.view", 0.5), ProfiledOp("aten.relu", 2.0),
            ProfiledOp("aten.addmm", 3.0), ProfiledOp("aten.mm", 4.0)]  # sum missing, view extra
    a = align(trace, prof)
    assert a.by_event == {0: 1.0, 1: 2.0, 2: 3.0, 7: 4.0}
    assert a.matched_s == 10.0 and a.unmatched_s == 0.5
    assert a.attributed_share == pytest.approx(10.0 / 10.5)
    assert a.profiler_only == {"aten.view": 0.5} and a.trace_only == {"aten.sum": 1}
