"""Timing of a mixture of experts' grouped GEMMs and routing on the eager timeline: the
CUTLASS grouped kernel is one launch; PyTorch's fallback and ``nonzero`` make the host wait for
the device (``passes.timing``)."""

from __future__ import annotations

import pytest
import torch
from tests.trace.test_trace_moe import GroupedMoE, LoopMoE

from nnperf.analysis import analyze
from nnperf.hardware import default_profile, load_gpu
from nnperf.kernels.engines import TRANSFORMER_ENGINE
from nnperf.kernels.grouped_gemm import TE_STREAMS, estimate_grouped_gemm
from nnperf.prediction import predict


def _ops(p, name):
    return [t for t in p.step.ops if t.op == name]


def test_grouped_gemm_is_one_launch_on_hopper_and_a_synced_loop_on_ampere():
    a = analyze(GroupedMoE(), inputs=(torch.randn(2, 16, 64),), dtype="bf16")
    h100 = _ops(predict(a, "h100"), "aten._grouped_mm")
    assert h100 and all(t.kernels == 1 and not t.host_sync for t in h100)
    a100 = predict(a, "a100")
    grouped = _ops(a100, "aten._grouped_mm")
    assert all(t.kernels == len(t.gemms) == 8 and t.host_sync for t in grouped)
    slices = {s.index: s for s in a100.step.host_slices}
    ends = {t.index: t.end_s for t in a100.step.ops}
    for t in grouped:  # the host issued it only once the device had finished the work before it
        before = max(end for index, end in ends.items() if index < t.index)
        assert slices[t.index].start_s >= before
    # each expert's GEMM is listed with its share of the op's time
    for t in grouped:
        assert sum(g.estimate.time_s for g in t.gemms) == pytest.approx(t.kernel_s)


def test_nonzero_makes_the_host_wait():
    p = predict(analyze(LoopMoE(), inputs=(torch.randn(2, 16, 64),)), "h100")
    nonzero = _ops(p, "aten.nonzero")
    assert nonzero
    slices = {s.index: s for s in p.step.host_slices}
    for t in nonzero:
        nxt = min(s.start_s for i, s in slices.items() if i > t.index)
        assert nxt >= t.end_s



def test_transformer_engines_experts_are_a_gemm_an_expert_over_its_streams():
    """Megatron-LM's layouts (``trace.config["linear_engine"]``) time the experts as Transformer
    Engine's GroupedLinear: one cuBLAS GEMM per expert, four streams at once, no host sync."""
    a = analyze(GroupedMoE(), inputs=(torch.randn(2, 16, 64),), dtype="bf16")
    a.trace.config["linear_engine"] = TRANSFORMER_ENGINE
    gpu = load_gpu("h100")
    grouped = _ops(predict(a, gpu), "aten._grouped_mm")
    assert grouped
    for t in grouped:
        est = estimate_grouped_gemm([(g.m, g.n, g.k) for g in t.count.gemms], dtype="bf16", gpu=gpu,
                                    profile=default_profile(gpu), min_bytes=t.count.bytes,
                                    engine=TRANSFORMER_ENGINE)
        assert est.path == TE_STREAMS
        assert t.kernels == len(t.gemms) == 8 and not t.host_sync
        assert t.kernel_s == pytest.approx(est.time_s)
