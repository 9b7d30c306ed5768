"""Every non-free op of the zoo's common training steps has a cost formula, and it runs."""

from __future__ import annotations

import pytest

from nnperf.passes.costs import lookup
from nnperf.trace.capture import trace_workload
from nnperf.trace.options import TraceOptions
from nnperf.zoo import get_model

MODELS = {
    "resnet18": (2, None, {"image_size": 32}),
    "mobilenet_v2": (2, None, {"image_size": 32}),
    "mnist-cnn": (2, None, {}),
    "gpt2": (2, 16, {"n_layer": 1, "n_embd": 64, "n_head": 2, "vocab": 100}),
    "llama-7b": (
        2,
        16,
        {"n_layer": 1, "dim": 64, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 128, "vocab": 100},
    ),
}
OPTIONS = {
    "adamw-foreach": TraceOptions(train=True, optimizer="adamw", optimizer_impl="foreach"),
    "amp-bf16": TraceOptions(train=True, optimizer="adamw", optimizer_impl="foreach", amp="bf16"),
    # with torch.amp.GradScaler: unscale, the found-inf sync, scale update
    "amp-fp16": TraceOptions(train=True, optimizer="adamw", optimizer_impl="foreach", amp="fp16"),
    "amp-fp16-fused": TraceOptions(train=True, optimizer="adamw", optimizer_impl="fused", amp="fp16"),
}


@pytest.mark.slow
@pytest.mark.parametrize("options", list(OPTIONS), ids=list(OPTIONS))
@pytest.mark.parametrize("model", list(MODELS))
def test_every_non_free_op_has_a_formula(model, options):
    batch, seq, overrides = MODELS[model]
    trace, _ = trace_workload(
        lambda: get_model(model).build(batch, seq, **overrides), OPTIONS[options]
    )
    missing = sorted({str(e.func) for e in trace.events if not e.free and lookup(e) is None})
    assert not missing, f"ops without a cost formula in {model}: {missing}"
    for event in trace.events:
        if not event.free:
            cost = lookup(event)(event)
            assert cost.flops >= 0
