"""The op-list check (``nnperf.measure.op_lists``): a device's ops lined up with the trace's,
stand-ins matched and views left out; on the CPU it finds the CPU's own decomposition of
dropout (``bernoulli_``, ``div_``, ``mul``), which the trace replaces by CUDA's fused kernel;
and every op list recorded on a GPU and committed (``validation/cuda_ops.py``) matches the
trace but for the differences listed there with their reasons."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch import nn

from nnperf.measure.op_lists import compare, device_step_ops, trace_ops
from nnperf.trace.capture import trace_workload
from nnperf.trace.options import TraceOptions
from nnperf.workload import Workload

ROOT = Path(__file__).resolve().parents[2]


def test_stand_ins_match_their_device_ops_and_views_are_left_out():
    device = Counter({"aten._scaled_dot_product_flash_attention": 2, "aten.mm": 3, "aten.view": 9,
                      "aten.bernoulli_": 1})
    traced = Counter({"nnperf.attention": 2, "aten.mm": 3, "aten.transpose": 4, "aten.native_dropout": 1})
    diff = compare(device, traced)
    assert diff.device_only == {"aten.bernoulli_": 1}
    assert diff.trace_only == {"aten.native_dropout": 1}
    assert compare(Counter({"aten.mm": 2}), Counter({"aten.mm": 2})).same


def test_on_the_cpu_it_finds_the_cpus_own_dropout():
    def build() -> Workload:
        model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.1), nn.Linear(8, 2))
        return Workload(model, (torch.randn(4, 8),))

    options = TraceOptions(optimizer="sgd", autocast_device="cpu")
    device = device_step_ops(build, options, torch.device("cpu"))
    trace, _ = trace_workload(build, options)
    diff = compare(device, trace_ops(trace))
    assert diff.trace_only.get("aten.native_dropout") == 1
    assert diff.device_only.get("aten.bernoulli_") == 1
    assert "aten.addmm" not in diff.device_only and "aten.addmm" not in diff.trace_only


RECORDED = sorted((ROOT / "validation" / "data").glob("*/cuda-ops.json"))


@pytest.mark.skipif(not RECORDED, reason="no GPU op list recorded yet (validation/gpu_session.sh 1 records one)")
@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.parent.name)
def test_recorded_gpu_op_lists_match_the_trace(path):
    sys.path.insert(0, str(ROOT / "validation"))
    import cuda_ops

    for name, diff in cuda_ops.differences(json.loads(path.read_text())).items():
        if diff["device_only"] or diff["trace_only"]:
            assert diff == cuda_ops.KNOWN.get(name, {}).get("diff"), (name, diff)
