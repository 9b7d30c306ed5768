"""What a trace records: phases, module attribution (backward included), free views, storage
lifetimes, optimizer implementations, dtypes under --amp and --dtype, inference."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch import nn

from nnperf.analysis import analyze
from nnperf.trace.events import KIND_ACTIVATION, KIND_PARAM

BATCH, D_IN, D_HID, D_OUT = 4, 8, 16, 4


class TwoLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(D_IN, D_HID)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(D_HID, D_OUT)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def _run(**kw):
    return analyze(TwoLayer(), inputs=(torch.randn(BATCH, D_IN),), **kw)


def test_training_step_has_three_phases_in_order():
    a = _run()
    phases = [e.phase for e in a.trace.events]
    assert set(phases) == {"forward", "backward", "optimizer"}
    # forward, then backward, then optimizer: each phase one contiguous block
    first = {p: phases.index(p) for p in set(phases)}
    last = {p: len(phases) - 1 - phases[::-1].index(p) for p in set(phases)}
    assert last["forward"] < first["backward"] and last["backward"] < first["optimizer"]
    assert all(e.module == "(optimizer)" for e in a.trace.by_phase("optimizer"))
    assert a.trace.mode == "train"


def test_backward_ops_are_attributed_to_the_module_that_created_them():
    a = _run(optimizer="sgd")
    mm = Counter(e.module for e in a.trace.by_phase("backward") if e.name == "aten.mm")
    # fc2: grad_input and grad_weight; fc1 (first layer): grad_weight only
    assert mm == {"fc2": 2, "fc1": 1}
    relu_bwd = [e for e in a.trace.events if e.name == "aten.threshold_backward"]
    assert [e.module for e in relu_bwd] == ["act"]
    fwd = Counter(e.module for e in a.trace.by_phase("forward") if e.name == "aten.addmm")
    assert fwd == {"fc1": 1, "fc2": 1}
    loss_ops = [e for e in a.trace.by_phase("forward") if e.module == "(loss)"]
    assert loss_ops, "the default loss (sum) runs under the (loss) pseudo-module"


def test_views_are_free_and_kernels_are_not():
    a = _run()
    by_name: dict[str, set[bool]] = {}
    for e in a.trace.events:
        by_name.setdefault(e.name, set()).add(e.free)
    for view in ("aten.t", "aten.view", "aten.detach", "aten.expand"):
        assert by_name.get(view) == {True}, view
    for kernel in ("aten.addmm", "aten.mm", "aten.relu", "aten.threshold_backward"):
        assert by_name.get(kernel) == {False}, kernel
    counted = {o.index for o in a.ops}
    assert not any(e.index in counted for e in a.trace.events if e.free)


def test_transpose_and_explicit_views_in_a_model_are_free():
    class Views(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 6)

        def forward(self, x):
            y = self.fc(x).view(2, 3, 6).transpose(1, 2).expand(4, 2, 6, 3)
            return y.detach() + 0 + y

    a = analyze(Views(), inputs=(torch.randn(6, 6),), train=False)
    names = {e.name: e.free for e in a.trace.events}
    assert names["aten.view"] and names["aten.transpose"] and names["aten.expand"]
    assert names["aten.detach"]
    assert not names["aten.add"]


def test_saved_activation_is_released_in_backward_and_parameters_never():
    a = _run()
    events, storages = a.trace.events, a.trace.storages
    relu = next(e for e in events if e.name == "aten.relu")
    saved = storages[relu.outputs[0].storage]  # saved by relu (and fc2) for backward
    assert saved.kind == KIND_ACTIVATION
    assert saved.created_by == relu.index
    assert saved.released_after is not None
    assert events[saved.released_after].phase == "backward"
    assert relu.outputs[0].storage in events[saved.released_after].releases
    params = [s for s in storages.values() if s.kind == KIND_PARAM]
    assert sorted(s.name for s in params) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
    assert all(s.released_after is None and s.created_by is None for s in params)
    assert sum(s.nbytes for s in params) == 4 * (D_IN * D_HID + D_HID + D_HID * D_OUT + D_OUT)


def test_gradients_are_created_in_backward_and_kept():
    a = _run()
    grads = [(sid, s) for sid, s in a.trace.storages.items() if s.kind == "gradient"]
    assert sorted(s.nbytes for _, s in grads) == sorted(
        4 * n for n in (D_IN * D_HID, D_HID, D_HID * D_OUT, D_OUT)
    )
    for _, s in grads:
        assert a.trace.events[s.created_by].phase == "backward"
        assert s.released_after is None


@pytest.mark.parametrize(
    "impl, marker",
    [("foreach", "aten._foreach_addcdiv_"), ("single", "aten.addcdiv_"), ("fused", "aten._fused_adamw_")],
)
def test_each_optimizer_implementation_traces(impl, marker):
    a = _run(optimizer_impl=impl)
    names = Counter(e.name for e in a.trace.by_phase("optimizer"))
    assert marker in names
    if impl == "single":
        assert names["aten.addcdiv_"] == 4  # one per parameter tensor
    optimizer_state = [s for s in a.trace.storages.values() if s.kind == "optimizer_state"]
    n_params = D_IN * D_HID + D_HID + D_HID * D_OUT + D_OUT
    # AdamW: exp_avg and exp_avg_sq per parameter (+ a scalar step per parameter)
    assert sum(s.nbytes for s in optimizer_state if s.nbytes > 4) >= 2 * 4 * n_params


def test_amp_bf16_makes_gemms_bf16_and_counts_weight_casts_as_weight_bytes():
    a = _run(amp="bf16", optimizer="sgd")
    assert {g.dtype for g in a.gemms} == {"bf16"}
    fwd = {o.module: o for o in a.ops if o.op == "aten.addmm"}
    # fc1's addmm reads its weight and bias as bf16 copies: 2 bytes each, all weight traffic
    assert fwd["fc1"].bytes_weights == 2 * (D_IN * D_HID + D_HID)
    assert fwd["fc1"].bytes_in == 2 * BATCH * D_IN  # the bf16 cast of the input
    # the casts of the fp32 parameters read fp32 weights
    casts = [
        o for o in a.ops
        if o.op == "aten._to_copy" and o.phase == "forward" and o.module == "fc1"
    ]
    assert sorted(o.bytes_weights for o in casts) == [0, 4 * D_HID, 4 * D_IN * D_HID]
    assert a.totals["param_bytes"] == 4 * a.totals["params"]  # master weights stay fp32


def test_dtype_bf16_casts_parameters_and_inputs():
    a = _run(dtype="bf16")
    params = D_IN * D_HID + D_HID + D_HID * D_OUT + D_OUT
    assert a.totals["params"] == params
    assert a.totals["param_bytes"] == 2 * params
    assert {g.dtype for g in a.gemms} == {"bf16"}
    assert a.config["dtype"] == "bf16"
    assert a.config["inputs"] == [{"shape": [BATCH, D_IN], "dtype": "bf16"}]


def test_inference_has_only_forward_events():
    a = _run(train=False)
    assert {e.phase for e in a.trace.events} == {"forward"}
    assert a.trace.mode == "inference"
    assert [g.role for g in a.gemms] == ["forward", "forward"]
    assert not any(s.kind in ("gradient", "optimizer_state") for s in a.trace.storages.values())
    assert a.totals["flops_backward"] == a.totals["flops_optimizer"] == 0


def test_zoo_inference_puts_dropout_and_batchnorm_in_eval_mode():
    a = analyze("resnet18", batch=1, train=False, image_size=32, num_classes=10)
    names = {e.name for e in a.trace.events}
    assert "aten.bernoulli_" not in names
    bn = [e for e in a.trace.events if "batch_norm" in e.name]
    assert bn and all("backward" not in e.name for e in bn)
