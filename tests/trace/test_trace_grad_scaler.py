"""fp16 AMP training steps run torch.amp.GradScaler: the traced scaler ops are those of a real
GradScaler step (checked against real CPU tensors listed by a TorchDispatchMode), bf16 and
``grad_scaler=False`` trace none, the found-inf read is a host sync for the timing pass and
the scaler's small tensors are device memory for the memory pass."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from nnperf.errors import UsageError
from nnperf.hardware import default_profile, load_gpu
from nnperf.passes.count import count_ops
from nnperf.passes.memory.model import classify, predict_memory
from nnperf.passes.timing import simulate_step
from nnperf.trace.capture import trace_workload
from nnperf.trace.events import KIND_BUFFER
from nnperf.trace.grad_scaler import GRAD_SCALER_MODULE
from nnperf.trace.options import TraceOptions
from nnperf.workload import Workload

B, D_IN, D_HID, D_OUT = 4, 8, 16, 4


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D_IN, D_HID), nn.ReLU(), nn.Linear(D_HID, D_OUT))


def mean_loss(out: torch.Tensor) -> torch.Tensor:
    # a mean, not the default sum, so the real reference step finds no inf at scale 2**16
    return out.float().mean()


def trace(real: bool = False, batch: int = B, model=make_model, **options):
    tr, _ = trace_workload(
        lambda: Workload(model(), (torch.randn(batch, D_IN),), loss_fn=mean_loss),
        TraceOptions(real=real, **options),
    )
    return tr


def signature(name: str, tensors: list) -> tuple:
    return (name, tuple((tuple(t.shape), t.dtype) for t in tensors))


def traced_scaler_ops(tr) -> list[tuple[str, tuple]]:
    """(phase, signature) of every op nnperf attributes to the GradScaler, in order."""
    return [
        (e.phase, signature(e.name, [*e.inputs, *e.outputs]))
        for e in tr.events
        if e.module == GRAD_SCALER_MODULE
    ]


class OpList(TorchDispatchMode):
    """Lists aten ops with the section of the loop that issued them and the autograd node."""

    def __init__(self):
        super().__init__()
        self.section = "forward"
        self.ops: list[tuple[str, object, str, tuple]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.namespace not in ("prim", "profiler"):
            flat = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
            name = func._schema.name.replace("::", ".")
            node = torch._C._current_autograd_node()
            self.ops.append((self.section, node, name, signature(name, flat)))
        return out


REAL_OPTIMIZERS = {
    ("adamw", "foreach"): lambda ps: torch.optim.AdamW(ps, lr=1e-3, foreach=True),
    ("adamw", "single"): lambda ps: torch.optim.AdamW(ps, lr=1e-3, foreach=False),
    ("adamw", "fused"): lambda ps: torch.optim.AdamW(ps, lr=1e-3, fused=True),
    ("sgd-momentum", "foreach"): lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, foreach=True),
}


def real_scaled_step(optimizer: str, impl: str) -> tuple[list[tuple[str, tuple]], OpList]:
    """A real CPU fp16-autocast loop with a real GradScaler; the second step is listed."""
    model = make_model()
    opt = REAL_OPTIMIZERS[optimizer, impl](list(model.parameters()))
    scaler = torch.amp.GradScaler("cpu")
    x = torch.randn(B, D_IN)
    listing = OpList()

    def pre(*_):
        listing.section = "optimizer"

    def post(*_):
        listing.section = "step"

    opt.register_step_pre_hook(pre)
    opt.register_step_post_hook(post)
    for _ in range(2):  # the first step creates scale, growth tracker and optimizer state
        listing.ops.clear()
        with listing:
            listing.section = "forward"
            with torch.autocast("cpu", dtype=torch.float16):
                loss = mean_loss(model(x))
            listing.section = "scale"
            scaled = scaler.scale(loss)
            scaled.grad_fn.metadata["scaler"] = True
            listing.section = "backward"
            scaled.backward()
            del loss, scaled
            listing.section = "step"
            scaler.step(opt)
            listing.section = "update"
            scaler.update()
        opt.zero_grad(set_to_none=True)
    phase = {"scale": "forward", "backward": "backward", "step": "backward", "update": "optimizer"}
    scaler_ops = [
        (phase[section], sig)
        for section, node, _, sig in listing.ops
        if section in ("scale", "step", "update")
        or (section == "backward" and node is not None and node.metadata.get("scaler"))
    ]
    return scaler_ops, listing


@pytest.mark.parametrize("optimizer, impl", list(REAL_OPTIMIZERS), ids=[f"{o}-{i}" for o, i in REAL_OPTIMIZERS])
def test_traced_scaler_ops_are_those_of_a_real_gradscaler_step(optimizer, impl):
    expected, listing = real_scaled_step(optimizer, impl)
    assert any(s == "optimizer" for s, *_ in listing.ops), "the real step found infs"
    names = [sig[0] for _, sig in expected]
    assert "aten._amp_foreach_non_finite_check_and_unscale_" in names
    assert names[-1] == "aten._amp_update_scale_"
    # the host sync exactly where PyTorch makes it: non-fused optimizers only
    assert ("aten._local_scalar_dense" in names) == (impl != "fused")
    tr = trace(optimizer=optimizer, optimizer_impl=impl, amp="fp16")
    assert traced_scaler_ops(tr) == expected
    # and the whole step, op for op, is the real loop's (the optimizer step ran: no inf)
    assert [e.name for e in tr.events] == [name for _, _, name, _ in listing.ops]


def test_real_tensors_trace_the_same_scaler_ops_as_fake_ones():
    assert traced_scaler_ops(trace(real=True, amp="fp16")) == traced_scaler_ops(trace(amp="fp16"))


@pytest.mark.parametrize(
    "options",
    [dict(amp="bf16"), dict(amp="fp16", grad_scaler=False), dict(amp="fp16", dtype="fp16"),
     dict(amp="fp16", optimizer="none"), dict(amp="fp16", train=False)],
    ids=["bf16", "fp16-off", "pure-fp16", "no-optimizer", "inference"],
)
def test_no_scaler_where_a_real_loop_has_none(options):
    tr = trace(**options)
    assert not tr.config["grad_scaler"]
    assert not any(e.module == GRAD_SCALER_MODULE or "_amp_" in e.name for e in tr.events)


def test_the_scaler_adds_its_ops_and_changes_nothing_else():
    with_scaler, without = trace(amp="fp16"), trace(amp="fp16", grad_scaler=False)
    assert with_scaler.config["grad_scaler"] and not without.config["grad_scaler"]
    rest = [(e.phase, e.module, e.name) for e in with_scaler.events if e.module != GRAD_SCALER_MODULE]
    assert rest == [(e.phase, e.module, e.name) for e in without.events]
    # forced on for bf16 too, when asked for
    assert trace(amp="bf16", grad_scaler=True).config["grad_scaler"]


def test_warm_up_step_leaves_the_scaler_in_its_steady_state():
    tr = trace(amp="fp16")
    state = {i.name: (sid, i) for sid, i in tr.storages.items() if i.kind == KIND_BUFFER}
    assert set(state) == {"(grad_scaler).scale", "(grad_scaler).growth_tracker"}
    for _, info in state.values():
        assert info.created_by is None and info.released_after is None and info.nbytes == 4
    scale_sid = state["(grad_scaler).scale"][0]
    (scale_mul,) = [e for e in tr.events if e.module == GRAD_SCALER_MODULE and e.phase == "forward"]
    assert scale_mul.name == "aten.mul" and scale_sid in {m.storage for m in scale_mul.inputs}
    update = tr.events[-1]
    assert update.name == "aten._amp_update_scale_" and update.phase == "optimizer"
    assert {m.storage for m in update.inputs} >= {sid for sid, _ in state.values()}


def test_found_inf_read_makes_the_host_wait_for_the_device():
    tr = trace(amp="fp16", batch=4096, model=lambda: nn.Sequential(nn.Linear(D_IN, 2048), nn.Linear(2048, D_OUT)))
    (read,) = [e for e in tr.events if e.name == "aten._local_scalar_dense" and e.module == GRAD_SCALER_MODULE]
    profile = default_profile()
    step = simulate_step(tr, count_ops(tr), load_gpu("t4"), profile)
    slices = {s.index: s for s in step.host_slices}
    device_done = max(t.end_s for t in step.ops if t.index < read.index and t.kernels)
    assert device_done > slices[read.index].end_s  # the device is behind: the wait is real
    # the host waits for the device, then for the value's copy back (the round trip)
    assert slices[read.index + 1].start_s == pytest.approx(device_done + profile.host_sync_s)


def test_the_hosts_busy_time_leaves_out_its_wait_at_the_found_inf_read():
    """``host_s`` is when the host has issued the step, its wait for the device at the found-inf
    read included; ``host_busy_s``, the host's own work, is that less the wait (the device still
    running when the read was issued, and the round trip after): OPT-175B's plan read "host
    16.8 s" where the host issued for about 1.5 s. The step's bound is judged on that work: a
    step whose device runs longer than the host issues is not host-bound, however long the host
    waited (its end, after the wait, passes the device's busy time)."""
    profile = default_profile()
    for batch in (4096, 32768):
        tr = trace(amp="fp16", batch=batch,
                   model=lambda: nn.Sequential(nn.Linear(D_IN, 2048), nn.Linear(2048, D_OUT)))
        (read,) = [e for e in tr.events if e.name == "aten._local_scalar_dense" and e.module == GRAD_SCALER_MODULE]
        step = simulate_step(tr, count_ops(tr), load_gpu("t4"), profile)
        slices = {s.index: s for s in step.host_slices}
        device_done = max(t.end_s for t in step.ops if t.index < read.index and t.kernels)
        waited = device_done + profile.host_sync_s - slices[read.index].end_s
        assert waited > 0
        assert step.host_busy_s == pytest.approx(step.host_s - waited)
    assert step.host_s > step.device_busy_s > step.host_busy_s and step.bound != "host"
    plain = trace(amp="fp16", grad_scaler=False)
    plain_step = simulate_step(plain, count_ops(plain), load_gpu("t4"), profile)
    assert plain_step.host_busy_s == pytest.approx(plain_step.host_s)  # no sync: the host never waits


def test_memory_pass_keeps_the_scaler_tensors_on_the_device():
    tr = trace(amp="fp16")
    roles = classify(tr)
    scaler_sids = [
        sid for sid, info in tr.storages.items()
        if (info.name or "").startswith(GRAD_SCALER_MODULE)
        or (info.created_by is not None and tr.events[info.created_by].module == GRAD_SCALER_MODULE)
    ]
    # scale, growth tracker, scaled loss, its gradient, inv_scale (fp64, its reciprocal, fp32),
    # found_inf and the per-device copies of inv_scale and found_inf
    assert len(scaler_sids) == 10
    assert all(roles[sid].on_device for sid in scaler_sids)
    (found_inf,) = [e for e in tr.events if e.name == "aten._local_scalar_dense" and e.module == GRAD_SCALER_MODULE]
    assert roles[found_inf.inputs[0].storage].on_device
    states = predict_memory(tr).model_states
    assert states["buffers"] - predict_memory(trace(amp="fp16", grad_scaler=False)).model_states["buffers"] == 4 + 4


@pytest.mark.parametrize(
    "options",
    [dict(grad_scaler=True, train=False), dict(grad_scaler=True, optimizer="none"),
     dict(grad_scaler=True, amp="fp16", dtype="fp16")],
)
def test_impossible_scaler_requests_are_usage_errors(options):
    with pytest.raises(UsageError):
        trace(**options)
