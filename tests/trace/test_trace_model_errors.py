"""Failures while the step runs: the model's (a TraceError naming module and op) versus
nnperf's own (a bug: the original exception with its traceback)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nnperf.errors import TraceError
from nnperf.request import ModelRequest
from nnperf.trace import recorder
from nnperf.trace.capture import trace_workload
from nnperf.trace.options import TraceOptions


def _trace(model: nn.Module, x: torch.Tensor, **options) -> None:
    from nnperf.loading import resolve

    _, build = resolve(ModelRequest(model, inputs=(x,)))
    trace_workload(build, TraceOptions(**options))


def test_a_bug_in_the_recorder_keeps_its_own_exception(monkeypatch):
    # A bug raised by recorder.py's own code: ``int(storage=..., ...)`` fails there, in C,
    # the way a wrong keyword or a missing key of nnperf's would.
    monkeypatch.setattr(recorder, "TensorMeta", int)
    with pytest.raises(TypeError, match=r"int\(\)"):
        _trace(nn.Linear(4, 2), torch.randn(3, 4))


def test_a_failing_loss_is_named():
    class NoFloats(nn.Module):
        def forward(self, x):
            return x.long()

    with pytest.raises(TraceError, match=r"in the loss function.*no floating-point tensor"):
        _trace(NoFloats(), torch.randn(3, 4))


def test_a_forward_with_the_wrong_number_of_inputs_shows_its_signature():
    class Two(nn.Module):
        def forward(self, x, y):
            return x + y

    with pytest.raises(TraceError, match=r"Two\.forward\(x, y\)"):
        _trace(Two(), torch.randn(3, 4))


def test_the_data_dependent_message_is_unchanged():
    class Masked(nn.Module):
        def forward(self, x):
            return x[x > 0]

    with pytest.raises(TraceError, match="depend on tensor values: aten::index") as info:
        _trace(Masked(), torch.randn(3, 4), train=False)
    assert "--real" in str(info.value)


@pytest.mark.parametrize("x_dtype", [torch.float32, torch.float16])
def test_a_matmul_of_two_dtypes_fails_as_on_the_device(x_dtype):
    """A bf16 Linear fed another dtype: PyTorch's CPU and CUDA kernels refuse it (checked here
    with --real's real tensors), its meta kernel does not, so the fake trace refuses it too."""
    layer = nn.Linear(8, 4).to(torch.bfloat16)
    with pytest.raises(RuntimeError, match="same dtype"):
        layer(torch.randn(2, 8, dtype=x_dtype))
    with pytest.raises(TraceError, match=r"in its forward \(Linear\.forward\), op aten\.addmm: .*same dtype.*bfloat16"):
        _trace(layer, torch.randn(2, 8, dtype=x_dtype))


def test_autocast_operands_are_one_dtype():
    """Under autocast the product's operands are cast before the op: nothing refused."""
    _trace(nn.Linear(8, 4), torch.randn(2, 8), amp="bf16")
