"""The memory model against committed real measurements: peak tensor memory of real CPU steps
(``validation/cpu_memory.py``, CPU allocator reports) re-predicted with the current code.

Every configuration of the file is traced again here, so a change to the tracer or the
memory passes that moves a prediction away from what a real step allocated fails this test.

Where the CPU runs the kernels the trace models, the replay is exact: every model without a
convolution (MLP, BERT, GPT-2, LLaMA blocks, AdamW/SGD, fp32/bf16/autocast, training and
inference) to a few bytes. CPU convolutions (oneDNN) also allocate scratch through the
allocator (a reordered weight, an output in a blocked layout, per-thread weight-gradient
buffers) that a GPU-modelled trace does not have; there the prediction may only fall short
of the measurement, never exceed it, and by no more than that scratch was seen to cost.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from nnperf.analysis import analyze_request
from nnperf.measure.validation import error_table
from nnperf.passes.memory.host import predict_host_memory

pytestmark = pytest.mark.accuracy

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "validation" / "data" / "cpu-memory.json"
#: A few bytes: real kernels wrap Python numbers (lr, betas) in 0-dim tensors fake ones lack.
EXACT_PERCENT = 0.05
ROUTING_PERCENT = 1.0
LOSS_PERCENT = 0.25
GPT2_EAGER_SHORT_PERCENT = 3.5
#: The largest share of a step's peak the CPU's convolution scratch was measured to add
#: (resnet18 inference at batch 2: the largest 3x3 convolution's reordered weight and output).
CONV_SCRATCH_PERCENT = 16.0


def _script():
    spec = importlib.util.spec_from_file_location("cpu_memory", ROOT / "validation" / "cpu_memory.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


DOC = json.loads(DATA.read_text())
MEASURED = [r for r in DOC["records"] if "error" not in r]


def test_the_data_says_where_and_how_it_was_measured():
    assert DOC["schema"] == "nnperf.cpu-memory-validation/1"
    env = DOC["environment"]
    assert env["device"] == "cpu" and env["torch"] and env["cpu"] and env["date"]
    assert all(r["memory_method"] == "cpu-allocator-events" for r in MEASURED)
    # every zoo model is in it (the published presets at full size are their families' classes, too
    # large for a CPU), and nearly every configuration could run on the CPU
    from nnperf.zoo import list_models

    assert {r["config"]["model"] for r in MEASURED} == {s.name for s in list_models(presets=False)}
    assert len(MEASURED) >= 0.9 * len(DOC["records"])


@pytest.fixture(scope="module")
def repredicted() -> list[dict]:
    script = _script()
    rows = []
    for record in MEASURED:
        request, options = script.request_and_options(record["config"])
        trace = analyze_request(request, options).trace
        rows.append({"config": record["config"]["name"], "model": record["config"]["model"],
                     "measured_peak_memory_bytes": record["measured_peak_bytes"],
                     "predicted_peak_memory_bytes": predict_host_memory(trace).peak_allocated,
                     "convolutions": any(e.name == "aten.convolution" for e in trace.events),
                     "routed": any(e.name == "aten._grouped_mm" for e in trace.events),
                     "loss_dominated": record["config"].get("loss_dominated", False)})
    return rows


def _error_percent(row: dict) -> float:
    measured = row["measured_peak_memory_bytes"]
    return 100 * (row["predicted_peak_memory_bytes"] - measured) / measured


def test_exact_where_the_cpu_runs_the_kernels_the_trace_models(repredicted):
    rows = [r for r in repredicted if not r["convolutions"] and not r["routed"] and not r["loss_dominated"]]
    assert len(rows) >= 40
    off = [f"{r['config']}: {_error_percent(r):+.3f}%" for r in rows if abs(_error_percent(r)) > EXACT_PERCENT]
    assert not off, "\n".join(off)


def test_convolutional_models_fall_short_only_by_the_cpu_convolution_scratch(repredicted):
    rows = [r for r in repredicted if r["convolutions"]]
    assert len(rows) >= 40
    off = [f"{r['config']}: {_error_percent(r):+.3f}%" for r in rows
           if not -CONV_SCRATCH_PERCENT <= _error_percent(r) <= EXACT_PERCENT]
    assert not off, "\n".join(off)


def test_mixture_of_experts_within_its_routing_assumption(repredicted):
    """The trace spreads tokens evenly over the experts; the real router does not (the routed
    rows, T x k, are the same; their split over the experts is not), which moved one peak of
    the ten by 0.28% when this was written: within 1%."""
    rows = [r for r in repredicted if r["routed"]]
    assert len(rows) >= 10
    off = [f"{r['config']}: {_error_percent(r):+.3f}%" for r in rows if abs(_error_percent(r)) > ROUTING_PERCENT]
    assert not off, "\n".join(off)


def test_losses_within_a_quarter_percent_where_they_decide_the_peak(repredicted):
    """Decoders whose cross entropy decides the peak (32,000 or 50,257 classes over 512 tokens,
    SGD keeping no state), with the loss eager, compiled (inductor's own CPU kernels: what it
    keeps was predicted from the partitioner's rules), chunked and chunked with its inner loss
    compiled. When this was written they were within 0.16%; the 0.25 MiB the eager and chunked
    LLaMA runs are off by, against the exact replay elsewhere, was not traced down. A compiled
    loss's fp32 log-softmax kept by mistake would be 30% here.

    One exception, stated: GPT-2 (tied embedding and output projection) with the eager loss
    under CPU autocast was 3.3% short (the CPU allocated 21 MiB more around its eager cross
    entropy; not traced down); the same model's compiled loss was exact."""
    rows = [r for r in repredicted if r["loss_dominated"]]
    assert len(rows) >= 6
    gpt2_eager = [r for r in rows if r["config"] == "gpt2-b2-train-sgd-amp-bf16"]
    assert len(gpt2_eager) == 1 and -GPT2_EAGER_SHORT_PERCENT <= _error_percent(gpt2_eager[0]) <= 0
    off = [f"{r['config']}: {_error_percent(r):+.3f}%" for r in rows
           if r not in gpt2_eager and abs(_error_percent(r)) > LOSS_PERCENT]
    assert not off, "\n".join(off)


def test_error_table_overall(repredicted):
    table = error_table(repredicted, key="predicted_peak_memory_bytes", measured_key="measured_peak_memory_bytes")
    overall = table["overall"]
    assert overall["n"] == len(MEASURED)
    assert overall["median_ape"] < EXACT_PERCENT
