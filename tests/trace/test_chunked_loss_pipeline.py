"""torchtitan's chunked loss on a pipeline's last stage (its ChunkedLossWrapper takes the last
stage's output projection, the stage stops at the final norm): on real tensors, the stages run
one after the other give the loss and every gradient of eager cross entropy on the unsplit
model; traced, the last stage runs the projection chunk by chunk in the loss, and holds less at
its peak than the eager loss's logits."""

from __future__ import annotations

import pytest
from twin_models import twin_llamas

from nnperf.layout import Execution, split_layers
from nnperf.trace.distributed import trace_rank
from nnperf.trace.loss import ChunkedLoss
from nnperf.trace.options import TraceOptions
from nnperf.trace.parallel.pipeline import split
from nnperf.zoo.llama import build

TINY = {"n_layer": 2, "dim": 16, "n_heads": 2, "n_kv_heads": 2, "ffn_hidden": 32, "vocab": 65}


def test_stages_with_a_chunked_loss_match_eager_cross_entropy():
    reference, staged = twin_llamas(TINY)
    expected = reference.loss_fn(reference.model(*reference.inputs))
    expected.backward()
    first, last = split(staged.model, split_layers(TINY["n_layer"], 2))
    loss = ChunkedLoss(staged.loss_fn, last, chunks=4)
    assert last.skip_head and last(first(*reference.inputs)).shape[-1] == TINY["dim"]  # the final norm's output
    got = loss(last(first(*reference.inputs)))
    got.backward()
    assert got.item() == pytest.approx(expected.item(), rel=1e-5)
    for p, q in zip(staged.model.parameters(), reference.model.parameters(), strict=True):
        assert (p.grad - q.grad).abs().max().item() <= 1e-4 * max(q.grad.abs().max().item(), 1e-12)


def _last_stage(loss: str):
    wide_vocab = {**TINY, "vocab": 8192}  # the logits outweigh the rest of the stage
    execution = Execution(world=2, pipeline=2, pipeline_schedule="1f1b", micro_batch=2, grad_accum=2)
    return trace_rank(lambda: build(4, 64, **wide_vocab), TraceOptions(optimizer="sgd", loss=loss), execution,
                      lambda model: [], rank=1)


def test_the_last_stage_projects_in_the_loss_chunk_by_chunk():
    from nnperf.analysis import Analysis
    from nnperf.hardware.catalog import load_gpu
    from nnperf.prediction import predict_analysis

    traced = {loss: _last_stage(loss) for loss in ("eager", "chunked")}
    events = traced["chunked"].trace.events
    assert sum(e.name == "aten._log_softmax" for e in events) == 8 * 2  # 8 chunks x 2 micro-batches
    assert not any(e.module.endswith("output") for e in events)  # no projection in the stage
    assert any(e.module.endswith("output") for e in traced["eager"].trace.events)
    peaks = {}
    for loss, rank in traced.items():
        analysis = Analysis.from_trace("llama", TraceOptions(optimizer="sgd", loss=loss), rank.trace, rank.workload)
        peaks[loss] = predict_analysis(analysis, load_gpu("h100")).memory.peak_allocated
    assert peaks["chunked"] < peaks["eager"]
