"""What activation checkpointing runs again in backward is marked as recomputation: its FLOPs
are the difference between the checkpointed and the plain step's backward (the forward is the
same), MFU leaves them out, and the module attribution after a checkpointed step is the plain
step's (non-reentrant checkpointing stops its recomputation with an exception, which used to
leave the recomputed block on the module stack)."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from nnperf.analysis import Analysis
from nnperf.hardware.catalog import load_gpu
from nnperf.layout import Execution
from nnperf.prediction import predict_analysis
from nnperf.search.memory_variants import apply_checkpointing
from nnperf.trace.blocks import repeated_blocks
from nnperf.trace.distributed import trace_rank
from nnperf.trace.options import TraceOptions
from nnperf.zoo import get_model


def _build():
    return get_model("llama-7b").build(batch=2, seq_len=16, n_layer=2, dim=64, n_heads=4, n_kv_heads=1,
                                       ffn_hidden=96, vocab=64)


def _analysis(policy: str | None) -> Analysis:
    execution = Execution(world=2, data="fsdp", shard=2, checkpoint=policy)
    prepare = None if policy is None else (lambda w: apply_checkpointing(w, selective=policy != "full" and policy))
    traced = trace_rank(_build, TraceOptions(), execution, repeated_blocks, prepare)
    return Analysis.from_trace("llama-7b", TraceOptions(), traced.trace, traced.workload)


@pytest.fixture(scope="module")
def plain() -> Analysis:
    return _analysis(None)


@pytest.mark.parametrize("policy", ["full", "selective-op"])
def test_recomputed_flops_are_what_checkpointing_adds_to_backward(plain: Analysis, policy: str):
    checkpointed = _analysis(policy)
    t, p = checkpointed.totals, plain.totals
    assert t["flops_forward"] == p["flops_forward"]
    assert p["flops_recomputed"] == 0
    assert t["flops_recomputed"] > 0
    recomputed = [e for e in checkpointed.trace.events if e.recomputed]
    assert {e.phase for e in recomputed} == {"backward"}
    # what is not marked is the plain backward plus checkpointing's bookkeeping: detached
    # inputs, and the block input's gradient summed with the residual's
    def backward_ops(analysis: Analysis, marked: bool) -> Counter:
        return Counter((e.name, tuple(tuple(m.shape) for m in e.outputs)) for e in analysis.trace.events
                       if e.phase == "backward" and e.recomputed == marked)

    extra = backward_ops(checkpointed, False) - backward_ops(plain, False)
    assert backward_ops(plain, False) - backward_ops(checkpointed, False) == Counter()
    assert {name for name, _ in extra} <= {"aten.detach", "aten.add"}
    adds = sum(n * math.prod(shapes[0]) for (name, shapes), n in extra.items() if name == "aten.add")
    assert t["flops_recomputed"] == pytest.approx(t["flops_backward"] - p["flops_backward"] - adds)
    gpu = load_gpu("h100")
    model = predict_analysis(plain, gpu).model_flops
    assert predict_analysis(checkpointed, gpu).model_flops == pytest.approx(model + adds)  # + the sums it adds


def test_the_optimizer_is_attributed_as_without_checkpointing(plain: Analysis):
    checkpointed = _analysis("full")

    def optimizer_modules(analysis: Analysis) -> set[str]:
        return {e.module for e in analysis.trace.events if e.phase == "optimizer"}

    assert optimizer_modules(checkpointed) == optimizer_modules(plain)
    assert not any(m.startswith("layers") for m in optimizer_modules(checkpointed))


def test_the_loops_own_work_after_backward_is_not_recomputation():
    """Gradient clipping and a GradScaler's unscale are recorded in the backward phase under
    their pseudo-modules; without checkpointing nothing runs again (a plan said "0.17 ms of it
    recomputation" with --checkpoint none and --clip-grad-norm)."""
    options = TraceOptions(amp="fp16", optimizer="adamw", clip_grad_norm=1.0, grad_scaler=True)
    traced = trace_rank(_build, options, Execution(world=1), repeated_blocks)
    modules = {e.module for e in traced.trace.events if e.phase == "backward"}
    assert {"(clip_grad_norm)", "(grad_scaler)"} <= modules  # both were recorded in backward
    assert not [e.name for e in traced.trace.events if e.recomputed]


def test_a_checkpointed_blocks_own_ops_are_recomputation():
    """The residual add ``h = x + attention(...)`` is the block's own op, in no submodule, and
    torch.utils.checkpoint recomputes the block's wrapped forward, which no module hook enters:
    it counts as recomputation all the same, once a block (the block's last add, whose output
    backward does not need, is not run again: non-reentrant checkpointing stops early)."""
    events = _analysis("full").trace.events
    residual = [e for e in events if e.phase == "forward" and e.name == "aten.add"
                and e.module in ("layers.0", "layers.1")]
    assert len(residual) == 4  # two a block
    shape = tuple(residual[0].outputs[0].shape)
    recomputed = [e for e in events if e.recomputed and e.name == "aten.add" and tuple(e.outputs[0].shape) == shape]
    assert len(recomputed) == 2
