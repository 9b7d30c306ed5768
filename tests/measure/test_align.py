"""Aligning profiler op trees with the trace's ops, on synthetic profiler events."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest

from nnperf.measure.align import ProfiledOp, align, flatten_profile
from nnperf.measure.kernel_times import KernelTimes


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
    ops = flatten_profile(roots, {"aten.addmm", "aten.mm", "aten.copy_"})
    assert [(o.name, o.time_s) for o in ops] == [
        ("aten.transpose", pytest.approx(3e-6)),
        ("aten.addmm", pytest.approx(90e-6)),  # copy_ inside addmm is not emitted again
        ("aten.mm", pytest.approx(60e-6)),
    ]
    mm = roots[1].cpu_children[0].cpu_children[0]
    gpu = flatten_profile(roots, {"aten.mm"}, kernels=KernelTimes(own_s={id(mm): 55e-6}))
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


def _lcs_length(a: list[str], b: list[str]) -> int:
    """Textbook dynamic programme, O(len(a) * len(b)): the reference for the fast diff."""
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def test_common_subsequence_is_a_longest_one():
    import random

    from nnperf.measure.align import common_subsequence

    rng = random.Random(7)
    for _ in range(300):
        a = [rng.choice("abc") for _ in range(rng.randint(0, 25))]
        b = [rng.choice("abc") for _ in range(rng.randint(0, 25))]
        pairs = common_subsequence(a, b)
        assert all(a[i] == b[j] for i, j in pairs)
        assert all(p[0] < q[0] and p[1] < q[1] for p, q in itertools.pairwise(pairs))
        assert len(pairs) == _lcs_length(a, b)


def test_every_op_matches_despite_random_insertions():
    import random

    rng = random.Random(3)
    names = [f"aten.op{rng.randint(0, 9)}" for _ in range(793)]
    profiled = []
    for name in names:
        if rng.random() < 0.05:
            profiled.append(ProfiledOp("aten.extra", 1.0))
        profiled.append(ProfiledOp(name, 1.0))
    a = align(list(enumerate(names)), profiled)
    assert a.matched_ops == 793 and a.trace_only == {}


def test_sdpa_kernels_are_the_traces_attention_ops():
    flash = _Ev("aten::_scaled_dot_product_flash_attention", 45, 1)
    flash_bwd = _Ev("aten::_scaled_dot_product_flash_attention_backward", 80, 6)
    roots = [_Ev("aten::scaled_dot_product_attention", 50, 0, [flash]),
             _Ev("autograd::engine::evaluate_function: ScaledDotProductFlashAttentionBackward0", 90, 5, [flash_bwd])]
    kernels = KernelTimes(own_s={id(flash): 40e-6, id(flash_bwd): 70e-6})
    ops = flatten_profile(roots, {"nnperf.attention", "nnperf.attention_backward"}, kernels=kernels)
    assert [(o.name, o.time_s) for o in ops] == [
        ("nnperf.attention", pytest.approx(40e-6)), ("nnperf.attention_backward", pytest.approx(70e-6))]


def test_kernels_launched_by_an_unknown_op_itself_are_kept():
    # an op the trace lacks launched 30 us of kernels itself and 20 us through a known child
    mm = _Ev("aten::mm", 40, 1)
    fused = _Ev("aten::_fused_thing", 100, 0, [mm])
    ops = flatten_profile([fused], {"aten.mm"}, kernels=KernelTimes(own_s={id(fused): 30e-6, id(mm): 20e-6}))
    assert sorted((o.name, round(o.time_s * 1e6, 6)) for o in ops) == [("aten._fused_thing", 30.0), ("aten.mm", 20.0)]


def test_cudnn_batch_norm_is_the_traces_native_batch_norm():
    # fp32 NCHW on a GPU: batch_norm -> _batch_norm_impl_index -> cudnn_batch_norm, and the
    # engine's CudnnBatchNormBackward0 -> cudnn_batch_norm_backward; the trace (CPU dispatch)
    # has native_batch_norm and its backward
    fwd = _Ev("aten::cudnn_batch_norm", 30, 2, [_Ev("aten::empty_like", 1, 3)])
    bwd = _Ev("aten::cudnn_batch_norm_backward", 60, 11)
    roots = [_Ev("aten::batch_norm", 40, 0, [_Ev("aten::_batch_norm_impl_index", 35, 1, [fwd])]),
             _Ev("autograd::engine::evaluate_function: CudnnBatchNormBackward0", 70, 10,
                 [_Ev("CudnnBatchNormBackward0", 65, 10, [bwd])])]
    known = {"aten.native_batch_norm", "aten.native_batch_norm_backward"}
    ops = flatten_profile(roots, known)
    assert [(o.name, o.time_s) for o in ops] == [("aten.native_batch_norm", pytest.approx(30e-6)),
                                                 ("aten.native_batch_norm_backward", pytest.approx(60e-6))]
    a = align([(4, "aten.native_batch_norm"), (9, "aten.native_batch_norm_backward")], ops)
    assert a.by_event == {4: pytest.approx(30e-6), 9: pytest.approx(60e-6)} and a.unmatched_s == 0.0
