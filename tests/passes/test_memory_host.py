"""CPU peak tensor memory of a traced step: hand counts, and a real CPU step measured by the
CPU allocator (``nnperf.measure.host_memory``) for the same model."""

from __future__ import annotations

import torch
from torch import nn

from nnperf.analysis import analyze, analyze_request
from nnperf.loading import resolve
from nnperf.measure.host_memory import peak_tensor_bytes
from nnperf.measure.step import build_step
from nnperf.passes.memory.host import predict_host_memory
from nnperf.request import ModelRequest
from nnperf.trace.options import TraceOptions

B, D_IN, D_HID, D_OUT = 8, 784, 1024, 10
F32 = 4


def _mlp():
    return nn.Sequential(nn.Linear(D_IN, D_HID), nn.ReLU(), nn.Linear(D_HID, D_OUT))


def test_inference_peak_by_hand():
    # weights and input live throughout; the peak is the ReLU: its input (the first Linear's
    # output) and its output are both alive, each B x D_HID
    params = (D_IN * D_HID + D_HID + D_HID * D_OUT + D_OUT) * F32
    x = B * D_IN * F32
    expected = params + x + 2 * B * D_HID * F32
    a = analyze(_mlp(), inputs=(torch.randn(B, D_IN),), train=False)
    report = predict_host_memory(a.trace)
    assert report.peak_allocated == expected
    assert sum(report.breakdown.values()) == expected


def _measured_and_predicted(model: str, options: TraceOptions, **request) -> tuple[int, int]:
    req = ModelRequest(model, **request)
    predicted = predict_host_memory(analyze_request(req, options).trace).peak_allocated
    _, build = resolve(req)
    step = build_step(build, options, torch.device("cpu"))
    step.run()
    step.run()
    return peak_tensor_bytes(step.run, step.state_tensors), predicted


#: Real kernels wrap Python numbers (AdamW's lr, betas) in 0-dim CPU tensors of a few bytes
#: that fake tensors never allocate; nothing else may differ.
SCALAR_SLACK = 64


def test_real_cpu_step_peak_equals_prediction_mlp_adamw():
    measured, predicted = _measured_and_predicted("mlp", TraceOptions(), batch=16)
    assert abs(predicted - measured) <= SCALAR_SLACK


def test_real_cpu_step_peak_equals_prediction_tied_gpt2_block():
    # tied embedding + residual stream + cross entropy: the engine's in-place gradient sums
    # and the logits kept alive through backward both show in the peak
    measured, predicted = _measured_and_predicted(
        "gpt2", TraceOptions(optimizer="sgd"), batch=1, seq_len=32,
        overrides={"n_layer": 1, "n_embd": 64, "n_head": 2, "vocab": 512},
    )
    assert abs(predicted - measured) <= SCALAR_SLACK
