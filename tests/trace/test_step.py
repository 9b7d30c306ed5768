"""The traced step and the measured step are one step: a real CPU step runs, op for op, what
the trace of the same workload records on fake tensors."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from nnperf.loading import resolve
from nnperf.measure.step import build_step
from nnperf.request import ModelRequest
from nnperf.trace.capture import trace_workload
from nnperf.trace.options import TraceOptions

CPU = torch.device("cpu")


class _OpNames(TorchDispatchMode):
    """The aten ops a real step runs, by name, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace not in ("prim", "profiler"):
            self.names.append(func._schema.name)
        return func(*args, **(kwargs or {}))


def _build():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    return resolve(ModelRequest(model, inputs=(torch.randn(5, 8),)))[1]()


OPTIONS = [
    TraceOptions(),  # AdamW, foreach
    TraceOptions(optimizer="sgd-momentum", optimizer_impl="single"),
    # autocast and a GradScaler; a real CPU step follows the CPU's autocast lists, so the trace
    # compared with it does too (a GPU trace follows CUDA's: test_autocast_cuda.py)
    TraceOptions(amp="fp16", optimizer="adam", autocast_device="cpu"),
    TraceOptions(amp="bf16", train=False, autocast_device="cpu"),
    TraceOptions(grads_persist=True, optimizer="sgd"),
]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: repr(o)[12:60])
def test_a_real_step_runs_the_ops_the_trace_records(options):
    traced = [e.func._schema.name for e in trace_workload(_build, options)[0].events]
    step = build_step(_build, options, CPU)
    # the trace is the steady state: optimizer and scaler state exist, and the scaler has
    # backed off to a scale whose gradients are finite (the trace assumes them finite)
    for _ in range(20):
        step.run()
    if options.grads_persist:  # the step starts with gradients, as the trace's does
        assert all(p.grad is not None for p in step.workload.model.parameters())
    with _OpNames() as seen:
        step.run()
    # zero_grad(set_to_none=False) closes the real step (one foreach kernel): the trace ends
    # before it, with the gradients it leaves
    closing = ["aten::_foreach_zero_"] if options.grads_persist else []
    assert seen.names == traced + closing
    # sanity of the comparison itself: the step did what the options ask for
    assert ("aten::mm" in traced) or ("aten::addmm" in traced)
    assert ("aten::_amp_update_scale_" in traced) == (options.amp == "fp16")
    assert any(n.startswith("aten::_foreach") for n in traced) == (
        options.train and options.optimizer_impl == "foreach")


def test_the_measured_step_ends_with_zero_grad_as_the_loop_would():
    default = build_step(_build, TraceOptions(optimizer="sgd"), CPU)
    default.run()
    assert all(p.grad is None for p in default.workload.model.parameters())
    kept = build_step(_build, TraceOptions(optimizer="sgd", grads_persist=True), CPU)
    kept.run()
    grads = [p.grad for p in kept.workload.model.parameters()]
    assert all(g is not None and not g.any() for g in grads)  # zeroed, not dropped


def test_the_optimizer_is_the_one_the_options_name():
    cases = {
        TraceOptions(): (torch.optim.AdamW, {"lr": 1e-3, "foreach": True}),
        TraceOptions(optimizer="adam", optimizer_impl="single"): (torch.optim.Adam,
                                                                  {"foreach": False}),
        TraceOptions(optimizer="sgd-momentum"): (torch.optim.SGD, {"lr": 1e-2, "momentum": 0.9}),
        TraceOptions(optimizer="sgd", optimizer_impl="fused"): (torch.optim.SGD,
                                                               {"momentum": 0.0, "fused": True}),
    }
    for options, (cls, settings) in cases.items():
        opt = build_step(_build, options, CPU).optimizer
        assert type(opt) is cls
        assert {k: opt.defaults[k] for k in settings} == settings
    assert build_step(_build, TraceOptions(optimizer="none"), CPU).optimizer is None


def test_an_unfused_step_runs_pytorchs_math_attention_in_the_input_dtype():
    """What ``measure`` runs for ``--sdpa unfused``: the math backend, reduced precision allowed
    (the trace's unfused kernels), and the settings restored after the step."""
    import torch.nn.functional as F
    from torch import nn

    from nnperf.trace.options import TraceOptions
    from nnperf.trace.step import Step

    seen = []

    class Attend(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(8, 8)

        def forward(self, x):
            from torch.nn.attention import SDPBackend
            from torch.nn.attention import _cur_sdpa_kernel_backends as backends

            seen.append((backends(), torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed()))
            q = self.proj(x).view(1, 4, 4, 2)
            assert backends() == [SDPBackend.MATH]
            return F.scaled_dot_product_attention(q, q, q)

    before = torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed()
    Step.of(Attend(), (torch.randn(4, 8),), lambda out: out.sum(), TraceOptions(sdpa="unfused")).run()
    assert seen[0][1] is True
    assert torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed() == before
