"""Under --amp a trace follows CUDA's autocast op lists (``trace.autocast_cuda``), a CPU
measurement's trace the CPU's: one test per rule where the two differ, and the lists held to
what the running torch registers for AutocastCUDA (and to autocast_mode.h where installed)."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nnperf.analysis import analyze_request
from nnperf.errors import TraceError
from nnperf.request import ModelRequest
from nnperf.trace import autocast_cuda as policy
from nnperf.trace.options import TraceOptions

BF16, FP32 = torch.bfloat16, torch.float32


class Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        return self.fn(self.proj(x))  # the linear's output is bf16 under autocast


def _trace(fn, device, x=None, loss=None):
    request = ModelRequest(Fn(fn), inputs=(torch.randn(4, 8) if x is None else x,), loss_fn=loss)
    return analyze_request(request, TraceOptions(amp="bf16", autocast_device=device, optimizer="sgd"))


def _forward_dtypes(a, op):
    """The model's own forward ops (not the default loss's)."""
    return [e.outputs[0].dtype for e in a.trace.events
            if e.name == op and e.phase == "forward" and e.module != "(loss)"]


def test_lists_are_the_ops_torch_registers_for_autocast_cuda():
    with contextlib.suppress(Exception):  # torchvision, where it loads, adds autocast kernels of its own
        import torchvision  # noqa: F401

    registered = {name.removeprefix("aten::")
                  for name in torch._C._dispatch_get_registrations_for_dispatch_key("AutocastCUDA")
                  if name.startswith("aten::")}
    assert policy.cuda_policy_ops() == registered


def test_lists_are_autocast_mode_h():
    header = Path(torch.__file__).parent / "include" / "ATen" / "autocast_mode.h"
    if not header.exists():
        pytest.skip("this torch install has no C++ headers")
    text = header.read_text()

    def listed(macro):
        body = text.split(f"#define {macro}(_)", 1)[1].split("\n\n", 1)[0]
        return {".".join(p.strip() for p in m.split(",")) for m in re.findall(r"_\(([^()]*)\)", body)}

    assert listed("AT_FORALL_LOWER_PRECISION_FP") == set(policy.LOWER_PRECISION) - {
        "cudnn_convolution", "cudnn_convolution_transpose"}  # registered in autocast_mode.cpp
    assert listed("AT_FORALL_FP32") == set(policy.FP32)
    assert listed("AT_FORALL_FP32_SET_OPT_DTYPE") == set(policy.FP32_SET_OPT_DTYPE)
    assert listed("AT_FORALL_PROMOTE") == set(policy.PROMOTE)


@pytest.mark.parametrize("fn, op, cuda, cpu", [
    # CUDA fp32 list, not CPU's
    (lambda y: F.layer_norm(y, (8,)), "aten.native_layer_norm", FP32, BF16),
    (lambda y: y.exp(), "aten.exp", FP32, BF16),
    (lambda y: y.pow(2), "aten.pow", FP32, BF16),
    (lambda y: y.rsqrt(), "aten.rsqrt", FP32, BF16),
    # CUDA fp32_set_opt_dtype: computed and returned in fp32
    (lambda y: F.softmax(y, dim=-1), "aten._softmax", FP32, BF16),
    (lambda y: y.sum(dim=-1), "aten.sum", FP32, BF16),
    (lambda y: y.cumsum(dim=-1), "aten.cumsum", FP32, BF16),
    # CPU fp32 list, not CUDA's: padding runs in the input's dtype on CUDA
    (lambda y: F.pad(y.view(1, 1, 4, 8), (1, 1, 1, 1), mode="reflect"), "aten.reflection_pad2d", BF16, FP32),
    # both lists: the low precision
    (lambda y: y @ y.t(), "aten.mm", BF16, BF16),
])
def test_rule(fn, op, cuda, cpu):
    assert _forward_dtypes(_trace(fn, "cuda"), op) == [cuda]
    assert _forward_dtypes(_trace(fn, "cpu"), op) == [cpu]


def test_mv_is_low_precision_on_cuda_only():
    """``mv``/``addmv`` are in CUDA's low-precision list, not the CPU's: fp32 operands are cast."""
    class Mv(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(8, 8))

        def forward(self, x):
            return torch.mv(self.w, x)

    for device, dtype in (("cuda", BF16), ("cpu", FP32)):
        a = analyze_request(ModelRequest(Mv(), inputs=(torch.randn(8),)),
                            TraceOptions(amp="bf16", autocast_device=device, optimizer="sgd"))
        assert _forward_dtypes(a, "aten.mv") == [dtype]


def test_cross_entropy_log_softmax_keeps_the_logits_dtype_on_cuda():
    """CUDA lists no cross_entropy_loss: its log_softmax gets dtype=input dtype explicitly
    (LossNLL.cpp), which fp32_set_opt_dtype keeps, and nll_loss (fp32 list) upcasts after; the
    CPU lists cross_entropy_loss as fp32."""
    target = torch.zeros(4, dtype=torch.long)
    loss = lambda out: F.cross_entropy(out, target)  # noqa: E731
    cuda = _trace(lambda y: y, "cuda", loss=loss)
    cpu = _trace(lambda y: y, "cpu", loss=loss)
    assert [e.outputs[0].dtype for e in cuda.trace.events if e.name == "aten._log_softmax"] == [BF16]
    assert [e.outputs[0].dtype for e in cpu.trace.events if e.name == "aten._log_softmax"] == [FP32]
    assert [e.inputs[0].dtype for e in cuda.trace.events if e.name == "aten.nll_loss_forward"] == [FP32]


def test_binary_cross_entropy_is_refused_as_on_cuda():
    loss = lambda out: F.binary_cross_entropy(torch.sigmoid(out), torch.zeros(4, 8))  # noqa: E731
    with pytest.raises(TraceError, match="unsafe to autocast"):
        _trace(lambda y: y, "cuda", loss=loss)
    assert _trace(lambda y: y, "cpu", loss=loss).coverage["uncovered"] == []


def test_a_weight_used_twice_is_cast_once_per_forward():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            return self.lin(self.lin(x))

    a = analyze_request(ModelRequest(Tied(), inputs=(torch.randn(4, 8),)),
                        TraceOptions(amp="bf16", optimizer="sgd"))
    weight_casts = [e for e in a.trace.events if e.name == "aten._to_copy" and e.phase == "forward"
                    and e.inputs[0].shape == (8, 8)]
    assert len(weight_casts) == 1


def test_the_cpu_autocast_is_itself_again_after_a_trace():
    _trace(lambda y: F.layer_norm(y, (8,)), "cuda")
    with torch.autocast("cpu", dtype=BF16):
        assert torch.mm(torch.randn(2, 2), torch.randn(2, 2)).dtype == BF16
        assert F.layer_norm(torch.randn(2, 8, dtype=BF16), (8,)).dtype == BF16
        assert F.pad(torch.randn(1, 1, 4, 4, dtype=BF16), (1, 1, 1, 1), mode="reflect").dtype == FP32


class _CheckpointedLinears(nn.Module):
    """Two linears in one checkpointed block: backward recomputes them under autocast."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        return checkpoint(lambda t: self.b(torch.relu(self.a(t))), x, use_reentrant=False)


def test_a_recomputed_blocks_weight_casts_die_with_its_backward():
    """The recomputation is an autocast region of its own (torch.utils.checkpoint enters
    torch.autocast): leaving it clears the cast cache, so the bf16 weight copies it made are
    freed by the end of backward, not kept until the optimizer step."""
    from nnperf.trace.capture import trace_workload
    from nnperf.workload import Workload

    model = _CheckpointedLinears()
    trace, _ = trace_workload(lambda: Workload(model, (torch.randn(4, 16, requires_grad=True),)),
                              TraceOptions(amp="bf16", optimizer="sgd"))
    weights = set(trace.param_storages)
    recast = {e.outputs[0].storage for e in trace.events
              if e.phase == "backward" and e.name == "aten._to_copy" and e.inputs[0].storage in weights}
    assert len(recast) >= 2  # both weights cast again (the biases too)
    released = {s for e in trace.events if e.phase == "backward" for s in e.releases}
    assert recast <= released
