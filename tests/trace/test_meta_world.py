"""A step recorded on meta tensors is the step recorded on fake tensors, op for op and
storage for storage; a step that needs what only fakes have (values, CPU autocast, a CPU
tensor in the model's code) is recorded on fakes. The reference is the same trace with the
meta attempt switched off (``meta_first=False``)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nnperf.trace import meta_world
from nnperf.trace.capture import trace_workload
from nnperf.trace.events import Trace
from nnperf.trace.options import TraceOptions
from nnperf.workload import Workload
from nnperf.zoo import MODELS

SMALL = {
    "mlp": (4, None, {}),
    "resnet18": (2, None, {"image_size": 64}),
    "mobilenet_v2": (2, None, {"image_size": 64}),
    "efficientnet_b0": (2, None, {"image_size": 64}),
    "convnext_tiny": (2, None, {"image_size": 64}),
    "vit_b_16": (2, None, {"n_layer": 2, "image_size": 64}),
    "bert-base": (2, 32, {"n_layer": 2}),
    "gpt2": (2, 64, {"n_layer": 2}),
    "llama-7b": (1, 64, {"n_layer": 2, "dim": 256, "n_heads": 4, "n_kv_heads": 2,
                         "ffn_hidden": 512, "vocab": 1000}),
}
OPTIONS = {
    "train fp32 foreach": {},
    "train amp bf16": {"amp": "bf16"},
    "train amp fp16 (GradScaler)": {"amp": "fp16"},
    "train bf16 weights, single-tensor SGD": {"dtype": "bf16", "optimizer": "sgd-momentum",
                                              "optimizer_impl": "single"},
    "inference": {"train": False},
}


def _events(tr: Trace) -> list[tuple]:
    return [(e.name, e.args, e.kwargs, e.inputs, e.outputs, e.phase, e.module, e.free,
             e.allocates, sorted(e.releases)) for e in tr.events]


def _both(build, **options) -> tuple[Trace, Trace]:
    meta, _ = trace_workload(build, TraceOptions(**options))
    fake, _ = trace_workload(build, TraceOptions(**options), meta_first=False)
    return meta, fake


def _assert_same(meta: Trace, fake: Trace) -> None:
    assert (meta.config.pop("tensors"), fake.config.pop("tensors")) == ("meta", "fake")
    assert _events(meta) == _events(fake)
    assert {k: repr(v) for k, v in meta.storages.items()} == \
        {k: repr(v) for k, v in fake.storages.items()}
    assert meta.config == fake.config
    assert (meta.param_storages, meta.param_shapes, meta.module_params, meta.module_output_bytes) == \
        (fake.param_storages, fake.param_shapes, fake.module_params, fake.module_output_bytes)


@pytest.mark.parametrize("name", SMALL)
@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS)
def test_zoo_step_on_meta_tensors_is_the_fake_one(name, options):
    batch, seq, overrides = SMALL[name]
    _assert_same(*_both(lambda: MODELS[name].build(batch, seq, **overrides), **options))


class _Literals(nn.Module):
    """Tensor literals in the forward: a scalar, a vector, one made for a device, and a
    factory without a device."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x) * torch.tensor(2.0) + torch.tensor([1.0, 2.0, 3.0, 4.0])
        empty = torch.tensor([], device=x.device)
        return torch.cat([empty, y.flatten()]) + torch.arange(y.numel())


def test_literals_are_recorded_as_host_constants_on_meta_tensors_too():
    meta, fake = _both(lambda: Workload(_Literals(), (torch.randn(2, 4),)))
    assert [e.name for e in meta.events if e.phase == "forward"].count("aten.lift_fresh") == 3
    _assert_same(meta, fake)


class _ReadsValues(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        start, stop = torch.tensor([0, 2]).tolist()  # a literal's values: a fake keeps them
        return self.fc(x)[:, start:stop + 2]


class _HostTensor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) + torch.ones(4, device="cpu")  # a CPU tensor beside the model's


class _Router(nn.Module):
    """Top-k routing over 4 experts, the experts looped over with data-dependent shapes."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(8, 4)
        self.experts = nn.ModuleList(nn.Linear(8, 8) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, chosen = torch.topk(self.gate(x), 2, dim=-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            rows, _ = torch.where(chosen == e)
            out = out.index_add(0, rows, expert(x[rows]))
        return out


@pytest.mark.parametrize("model, x", [
    (_ReadsValues, torch.randn(2, 4)),
    (_HostTensor, torch.randn(2, 4)),
    (_Router, torch.randn(8, 8)),
], ids=["reads a literal's values", "a CPU tensor in forward", "MoE routing"])
def test_a_step_meta_tensors_cannot_run_is_recorded_on_fakes(model, x):
    trace, _ = trace_workload(lambda: Workload(model(), (x,)), TraceOptions())
    assert trace.config["tensors"] == "fake"


@pytest.mark.parametrize("options", [
    TraceOptions(amp="bf16", autocast_device="cpu"), TraceOptions(optimizer_impl="fused"),
], ids=["CPU autocast lists", "a fused optimizer"])
def test_steps_meta_tensors_cannot_run_are_not_tried_on_them(options):
    assert not meta_world.eligible(options)
    trace, _ = trace_workload(lambda: Workload(nn.Linear(4, 4), (torch.randn(2, 4),)), options)
    assert trace.config["tensors"] == "fake"


def test_real_traces_stay_real():
    trace, _ = trace_workload(lambda: Workload(nn.Linear(4, 4), (torch.randn(2, 4),)),
                              TraceOptions(real=True))
    assert trace.config["tensors"] == "real"


def test_a_built_model_is_restored_after_a_meta_trace():
    model = nn.Linear(4, 4)
    weight = model.weight
    before = weight.detach().clone()
    trace, _ = trace_workload(lambda: Workload(model, (torch.randn(2, 4),)), TraceOptions())
    assert trace.config["tensors"] == "meta"
    assert model.weight is weight and torch.equal(model.weight, before) and model.weight.grad is None


def test_an_accelerator_factory_builds_on_meta_in_a_meta_trace():
    class Cuda(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x)

    from nnperf.trace.construction import build_as_user_code

    def build() -> Workload:
        model = build_as_user_code(lambda: Cuda().to("cuda"))
        return Workload(model, (torch.randn(2, 4, device="cuda"),))

    meta, fake = _both(lambda: build_as_user_code(build))
    _assert_same(meta, fake)


CONV = torch.ops.aten.convolution.default
BATCH_NORM = torch.ops.aten.native_batch_norm.default


def _conv_args(x: torch.Tensor, w: torch.Tensor) -> tuple:
    return (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)


@pytest.mark.parametrize("channels_last", [False, True, False], ids=["nchw", "nhwc", "nchw-again"])
def test_a_cpu_shaped_op_answers_as_the_cpu_kernel_each_time_its_inputs_layout_comes_back(channels_last):
    """The CPU-shaped ops' output layouts are kept by their inputs' shapes, strides and
    arguments: the same shapes in another memory format are another call (the NHWC case between
    two NCHW ones would be answered wrongly by a key of shapes alone), each against the real CPU
    kernel's output."""
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    real = CONV(*_conv_args(torch.randn(2, 3, 8, 8).to(memory_format=fmt), torch.randn(4, 3, 3, 3)))
    x = torch.empty(2, 3, 8, 8, device="meta").to(memory_format=fmt)
    for _ in range(2):  # a kept answer is a fresh tensor of the same layout
        out = meta_world.call(CONV, _conv_args(x, torch.empty(4, 3, 3, 3, device="meta")), {})
        assert out.is_meta and (tuple(out.shape), out.stride()) == (tuple(real.shape), real.stride())


def test_batch_norm_in_eval_keeps_the_cpu_kernels_empty_statistics():
    def args(x, running):
        return (x, torch.ones(3) if not x.is_meta else torch.empty(3, device="meta"), None, running,
                running.clone(), False, 0.1, 1e-5)

    real = BATCH_NORM(*args(torch.randn(4, 3, 5, 5), torch.zeros(3)))
    for _ in range(2):
        out = meta_world.call(BATCH_NORM, args(torch.empty(4, 3, 5, 5, device="meta"),
                                               torch.empty(3, device="meta")), {})
        assert [tuple(t.shape) for t in out] == [tuple(t.shape) for t in real]


def test_a_request_the_step_refuses_on_meta_tensors_is_not_traced_again_on_fakes(monkeypatch):
    """An option the step cannot use (``--sdpa unfused`` on a model that calls no SDPA) is the
    request's mistake, the same on fakes: it is said at once, not after a second trace."""
    import nnperf.trace.capture as capture
    from nnperf.errors import UsageError
    from nnperf.trace.attention import NO_SDPA_CALLED

    def no_fakes(*args, **kwargs):
        raise AssertionError("traced again on fake tensors")

    monkeypatch.setattr(capture, "TraceFakeMode", no_fakes)
    with pytest.raises(UsageError) as refused:
        trace_workload(lambda: Workload(nn.Sequential(nn.Linear(8, 8)), (torch.randn(2, 8),)),
                       TraceOptions(sdpa="unfused"))
    assert str(refused.value) == NO_SDPA_CALLED


def test_an_op_with_fresh_outputs_answers_as_its_meta_kernel_each_time():
    """A pointwise op between a channels-last and a broadcast tensor, twice, against what the
    meta kernel itself gives (its output strides follow the first input's memory format)."""
    add = torch.ops.aten.add.Tensor
    x = torch.empty(2, 3, 4, 4, device="meta").to(memory_format=torch.channels_last)
    y = torch.empty(3, 1, 1, device="meta")
    expected = add(x, y)
    for _ in range(2):
        out = meta_world.call(add, (x, y), {})
        assert out is not x and (tuple(out.shape), out.stride(), out.dtype) == (
            tuple(expected.shape), expected.stride(), expected.dtype)


def test_an_alias_its_schema_does_not_declare_is_never_a_kept_answer():
    """``_unsafe_view`` returns a view of its input without saying so in its schema: each call
    must share the input's storage, as the fake trace records it."""
    view = torch.ops.aten._unsafe_view.default
    x = torch.empty(2, 6, device="meta")
    for _ in range(2):
        out = meta_world.call(view, (x, [12]), {})
        assert out.untyped_storage()._cdata == x.untyped_storage()._cdata


def test_a_factory_without_a_dtype_follows_the_default_dtype_of_each_call():
    ones = torch.ops.aten.ones.default
    before = torch.get_default_dtype()
    try:
        for default in (torch.float32, torch.float64, torch.float32):
            torch.set_default_dtype(default)
            assert meta_world.call(ones, ([2],), {"device": torch.device("meta")}).dtype == default
    finally:
        torch.set_default_dtype(before)
