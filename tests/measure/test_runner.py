"""Measuring real steps on the CPU: timing, attribution, JSON beside a prediction, OOM."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from nnperf.errors import ResourceError, UsageError
from nnperf.hardware import default_profile, load_gpu
from nnperf.measure.runner import combined_json, measure, measured_by_module
from nnperf.passes.timing import TimingOptions
from nnperf.prediction import predict_analysis
from nnperf.request import InputSpec, ModelRequest
from nnperf.trace.options import TraceOptions

CPU = torch.device("cpu")
SLEEP_S = 0.02


class Sleepy(nn.Module):
    """A linear layer whose forward also sleeps: the step time has a known floor."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(SLEEP_S)
        return self.lin(x)


def test_step_time_of_a_known_sleep_and_attribution():
    m, _ = measure(ModelRequest(Sleepy(), input_spec=InputSpec(shapes=((4, 8),))),
                   TraceOptions(train=False), device=CPU, steps=3, warmup=1)
    assert m.step.n == 3
    assert m.step.median >= SLEEP_S  # a step sleeps at least that long, however busy the machine
    # the sleep is no aten op: every traced op is found in the profile (how large a share of
    # the step the ops are is a timing, which a busy machine moves)
    assert m.alignment.trace_only == {}
    assert m.alignment.attributed_share > 0.5
    assert m.mode == "inference" and m.batch == 4


@pytest.fixture(scope="module")
def mlp_train():
    return measure(ModelRequest("mlp", batch=8, overrides={"widths": "32,64,10"}), device=CPU,
                   steps=3, warmup=1)


def test_training_step_modules_and_memory(mlp_train):
    m, analysis = mlp_train
    non_free = [e for e in analysis.trace.events if not e.free]
    assert m.alignment.matched_ops == len(non_free)  # every traced op found in the profile
    mods = measured_by_module(m, analysis, depth=1)
    assert {"", "0", "2", "(loss)", "(optimizer)"} <= set(mods)
    parts = sum(v for k, v in mods.items() if k)
    assert mods[""] == pytest.approx(m.alignment.matched_s)  # every op is under the root
    assert parts <= mods[""] * (1 + 1e-9)
    assert m.memory_method == "cpu-allocator-events"
    # at least the weights, their gradients and AdamW's two moments (hand count: 4 x P x 4 B)
    params = (32 * 64 + 64) + (64 * 10 + 10)
    assert m.peak_memory_bytes >= 4 * params * 4


def test_json_has_measured_values_beside_predicted(mlp_train):
    m, analysis = mlp_train
    gpu = load_gpu("h100")
    p = predict_analysis(analysis, gpu, default_profile(gpu), TimingOptions())
    doc = combined_json(m, analysis, p, depth=1)
    tot = doc["totals"]
    assert tot["measured_step_time_s"] == m.step.median
    assert tot["step_time_error"] == pytest.approx((tot["step_time_s"] - m.step.median) / m.step.median)
    assert tot["measured_step_time_spread"]["n"] == 3
    root = next(r for r in doc["modules"] if r["name"] == "")
    assert root["error"] == pytest.approx((root["time_s"] - root["measured_time_s"]) / root["measured_time_s"])
    assert sum(r["measured_time_s"] for r in doc["ops"]) == pytest.approx(m.alignment.matched_s)
    assert doc["prediction_available"] is True and doc["measurement"]["module_time_compared_with"] == "time_s"


def test_out_of_memory_is_reported_and_the_process_stays_usable(monkeypatch):
    import nnperf.measure.runner as runner

    def boom(*args, **kwargs):
        raise RuntimeError("CUDA out of memory. Tried to allocate 80.00 GiB")

    monkeypatch.setattr(runner, "time_repeats", boom)
    request = ModelRequest("mlp", batch=8, overrides={"widths": "16,8"})
    kwargs = dict(device=CPU, steps=2, warmup=0, profile_ops=False)
    with pytest.raises(ResourceError, match="does not fit at batch 8"):
        measure(request, TraceOptions(train=False), **kwargs)
    monkeypatch.undo()
    m, _ = measure(request, TraceOptions(train=False), **kwargs)  # same process, works again
    assert m.step.n == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_measurement_reports_allocated_peak():
    m, analysis = measure(ModelRequest("mlp", batch=64), device=torch.device("cuda"), steps=3,
                          warmup=2)
    params = sum(p.numel() * 4 for p in analysis.workload.model.parameters())
    assert m.memory_method == "torch.cuda.max_memory_allocated"
    assert m.peak_memory_bytes >= 4 * params  # weights, grads and two AdamW moments


def test_a_precision_without_a_device_kernel_is_a_usage_error_not_a_traceback():
    # PyTorch 2.x has no CPU bf16 kernel for avg_pool3d, which local_response_norm uses
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.LocalResponseNorm(2))
    request = ModelRequest(model, inputs=(torch.randn(1, 3, 8, 8),))
    with pytest.raises(UsageError, match=r"cannot run on .* in --dtype bf16: .*avg_pool3d"):
        measure(request, TraceOptions(dtype="bf16", train=False), device=CPU, steps=1, warmup=0)


def test_ops_the_device_runs_differently_are_not_matched_rather_than_zero():
    # the trace models CUDA's fused native_dropout; the CPU runs bernoulli_ and mul instead
    model = nn.Sequential(nn.Linear(16, 32), nn.Dropout(0.5), nn.Linear(32, 4))
    request = ModelRequest(model, inputs=(torch.randn(8, 16),))
    m, analysis = measure(request, TraceOptions(optimizer="sgd"), device=CPU, steps=1, warmup=1)
    doc = combined_json(m, analysis, None, depth=1)
    rows = {r["name"]: r for r in doc["modules"]}
    assert rows["1"]["measured_time_s"] is None  # the dropout module: nothing matched
    assert rows["0"]["measured_time_s"] > 0 and rows["2"]["measured_time_s"] > 0
    ops = {r["op"]: r for r in doc["ops"]}
    assert ops["aten.native_dropout"]["measured_time_s"] is None
    assert "aten.native_dropout" in doc["measurement"]["attribution"]["trace_only"]


class _RecordsSettings(nn.Module):
    """A linear layer that notes the cuDNN and TF32 switches each forward runs under."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 4)
        self.seen: list[tuple[bool, bool]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append((torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32))
        return self.lin(x)


def test_the_step_runs_with_cudnn_benchmark_and_it_is_restored_after():
    model = _RecordsSettings()
    before = (torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32)
    m, _ = measure(ModelRequest(model, inputs=(torch.randn(2, 8),)), TraceOptions(train=False), device=CPU,
                   steps=2, warmup=1, cudnn_benchmark=True, profile_ops=False, back_to_back=True)
    # the real steps: warm-up, timed, back-to-back and the host-memory step (no profiled
    # step); the trace's forward (fake tensors) ran before them
    real = model.seen[-(1 + 2 + 2 + 1):]
    assert len(model.seen) > len(real) and all(seen == (True, False) for seen in real)
    assert m.cudnn_benchmark is True and m.tf32 is False
    assert (torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32) == before
    assert m.back_to_back_step_s is not None and m.back_to_back_step_s > 0
    doc = m.to_json()
    assert doc["cudnn_benchmark"] is True and doc["unmatched_s"] is None  # not profiled
    assert doc["peak_reserved_bytes"] is None  # no caching allocator on the CPU


def test_unattributed_time_is_in_the_measurement(mlp_train):
    m, _ = mlp_train
    doc = m.to_json()
    assert doc["unmatched_s"] == m.alignment.unmatched_s >= 0.0
    assert doc["attribution"]["matched_s"] + doc["unmatched_s"] == pytest.approx(m.alignment.total_s)
