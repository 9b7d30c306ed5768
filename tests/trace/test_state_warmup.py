"""The unrecorded warm-up step skips in-place arithmetic on fake tensors: the recorded step
must be the one recorded after a warm-up that ran every op (the reference here: the same
trace with the shortcut switched off), for every optimizer and implementation nnperf offers,
with and without a GradScaler; and the state it creates must have the shapes and dtypes of a
real optimizer's state on real tensors."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn

import nnperf.trace.capture as capture
from nnperf.trace.capture import trace_workload
from nnperf.trace.options import OPTIMIZER_IMPLS, OPTIMIZERS, TraceOptions
from nnperf.trace.state_warmup import skip_inplace_math
from nnperf.trace.step import make_optimizer
from nnperf.workload import Workload


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.ReLU(), nn.Linear(16, 4))


def record(monkeypatch: pytest.MonkeyPatch, shortcut: bool, **options) -> list[tuple]:
    if not shortcut:
        monkeypatch.setattr(capture, "skip_inplace_math", contextlib.nullcontext)
    trace, _ = trace_workload(
        lambda: Workload(make_model(), (torch.randn(4, 8),), loss_fn=lambda out: out.float().mean()),
        TraceOptions(train=True, **options))
    monkeypatch.undo()
    return [(e.name, e.phase, [(tuple(t.shape), t.dtype) for t in e.outputs],
             [(tuple(t.shape), t.dtype) for t in e.inputs]) for e in trace.events]


@pytest.mark.parametrize("optimizer", [o for o in OPTIMIZERS if o != "none"])
@pytest.mark.parametrize("impl", OPTIMIZER_IMPLS)
def test_recorded_step_is_the_one_after_a_full_warm_up(monkeypatch, optimizer, impl):
    if impl == "fused" and optimizer == "sgd":
        pytest.skip("plain SGD has no state to warm up")
    fast = record(monkeypatch, True, optimizer=optimizer, optimizer_impl=impl)
    full = record(monkeypatch, False, optimizer=optimizer, optimizer_impl=impl)
    assert fast == full
    assert any(phase == "optimizer" for _, phase, *_ in fast)


def test_with_a_grad_scaler(monkeypatch):
    fast = record(monkeypatch, True, amp="fp16")
    full = record(monkeypatch, False, amp="fp16")
    assert fast == full
    assert any("amp_update_scale" in name for name, *_ in fast)


def test_state_matches_a_real_optimizers_state():
    from torch._subclasses.fake_tensor import FakeTensorMode

    options = TraceOptions(train=True, optimizer="adam")
    real_model = make_model()
    real = make_optimizer(real_model, options)
    for p in real_model.parameters():
        p.grad = torch.zeros_like(p)
    real.step()
    with FakeTensorMode():
        fake_model = make_model()
        fake = make_optimizer(fake_model, options)
        for p in fake_model.parameters():
            p.grad = torch.zeros_like(p)
        with skip_inplace_math():
            fake.step()
    shapes = [{k: (tuple(v.shape), v.dtype, v.device.type) for k, v in s.items()} for s in fake.state.values()]
    assert shapes == [{k: (tuple(v.shape), v.dtype, v.device.type) for k, v in s.items()}
                      for s in real.state.values()]
    # the step counters ran (they are host values the next step reads)
    assert all(int(s["step"].item()) == 1 for s in real.state.values())
    assert all(int(s["step"].constant.item()) == 1 for s in fake.state.values()
               if s["step"].constant is not None)


def test_real_tensors_and_constants_are_never_skipped():
    t = torch.ones(3)
    with skip_inplace_math():
        t.mul_(2)
    assert t.tolist() == [2.0, 2.0, 2.0]


def test_inplace_math_on_fakes_is_skipped_and_creation_is_not():
    from torch._subclasses.fake_tensor import FakeTensorMode

    seen: list[str] = []

    class Listing(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    with FakeTensorMode(), Listing(), skip_inplace_math():
        a = torch.empty(5, 7)
        b = a.mul_(3)  # skipped: nothing reaches the listing mode below
        torch._foreach_add_([a, a], 1.0)
        c = a.t_()  # changes metadata: runs
        d = torch.sqrt(a)  # creates a tensor: runs
    assert b is a and c is a and tuple(a.shape) == (7, 5) and tuple(d.shape) == (7, 5)
    assert not any("mul_" in s or "_foreach_add_" in s for s in seen)
    assert any("t_" in s for s in seen) and any("sqrt" in s for s in seen)


@pytest.mark.parametrize("meta_first", [True, False], ids=["meta", "fake"])
def test_the_recorded_step_is_the_optimizers_second(meta_first):
    """One warm-up step, then the recorded one: AdamW's bias corrections are step 2's. (The
    host step counter once advanced twice per step on fakes: both the fake mode and the
    trace's constant tracking applied the in-place add.)"""
    trace, _ = trace_workload(lambda: Workload(make_model(), (torch.randn(4, 8),)),
                              TraceOptions(optimizer="adamw", optimizer_impl="foreach"),
                              meta_first=meta_first)
    assert trace.config["tensors"] == ("meta" if meta_first else "fake")
    div = next(e for e in trace.events if e.name == "aten._foreach_div_" and e.phase == "optimizer")
    beta2 = torch.optim.AdamW([torch.nn.Parameter(torch.ones(1))]).defaults["betas"][1]
    assert div.args[1] == pytest.approx([(1 - beta2 ** 2) ** 0.5] * 6)  # 6 parameters


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_a_sharded_ranks_step_is_the_one_after_a_full_warm_up(monkeypatch, optimizer):
    """FSDP2 and tensor parallelism hold parameters, gradients and state as DTensors over fakes:
    their in-place math is skipped before the DTensor dispatches it, and the rank's recorded
    step (its ops and collectives) is the one recorded after a warm-up that ran everything."""
    from nnperf.layout import Execution
    from nnperf.trace.blocks import repeated_blocks
    from nnperf.trace.distributed import trace_rank
    from nnperf.zoo import get_model

    execution = Execution(world=4, data="fsdp", shard=2, tensor=2, micro_batch=1, grad_accum=1)

    def rank_events(shortcut: bool) -> list[tuple]:
        if not shortcut:
            monkeypatch.setattr(capture, "skip_inplace_math", contextlib.nullcontext)
        traced = trace_rank(lambda: get_model("llama-7b").build(batch=1, seq_len=16, n_layer=2, dim=64, n_heads=4,
                                                                ffn_hidden=128, vocab=256),
                            TraceOptions(optimizer=optimizer), execution, repeated_blocks)
        monkeypatch.undo()
        return [(e.name, e.phase, [(tuple(t.shape), t.dtype) for t in e.outputs]) for e in traced.trace.events]

    fast, full = rank_events(True), rank_events(False)
    assert fast == full
    assert any(phase == "optimizer" and name.startswith("aten._foreach_") for name, phase, _ in fast)


def test_inplace_math_on_a_wrapper_over_fakes_is_skipped_before_it_dispatches():
    """A wrapper subclass (DTensor is one) whose inner tensors are fakes without values: its
    in-place math never reaches its own dispatch (a DTensor's sharding propagation); an op that
    creates a tensor still does."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._pytree import tree_map

    seen: list[str] = []

    class Wrapper(torch.Tensor):
        @staticmethod
        def __new__(cls, inner):
            return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype, device=inner.device)

        def __init__(self, inner):
            self.inner = inner

        def __tensor_flatten__(self):
            return ["inner"], None

        @staticmethod
        def __tensor_unflatten__(inner_tensors, meta, outer_size, outer_stride):
            return Wrapper(inner_tensors["inner"])

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            seen.append(str(func))
            unwrap = lambda x: x.inner if isinstance(x, Wrapper) else x  # noqa: E731
            out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))
            return tree_map(lambda x: Wrapper(x) if isinstance(x, torch.Tensor) else x, out)

    with FakeTensorMode():
        inner = torch.empty(3)
    w = Wrapper(inner)
    with skip_inplace_math():
        assert w.mul_(2) is w
        torch._foreach_add_([w, w], 1.0)
        root = torch.sqrt(w)
    assert isinstance(root, Wrapper) and tuple(root.shape) == (3,)
    assert not any("mul_" in s or "_foreach_add_" in s for s in seen), seen
    assert any("sqrt" in s for s in seen)
