"""A traced pipeline stage's transfers among its saved activations (``passes.memory.transfers``),
against the tensors each stage role receives and sends, sized by hand. Traces three small stage
roles (seconds)."""

from __future__ import annotations

import pytest

from nnperf.hardware.catalog import load_gpu
from nnperf.hardware.cluster import load_cluster
from nnperf.layout import Execution
from nnperf.passes.memory.transfers import TransferBytes
from nnperf.request import ModelRequest
from nnperf.search.plan.rank import rank_cost
from nnperf.trace.options import TraceOptions

BATCH, SEQ, DIM = 2, 64, 128
LLAMA = {"dim": DIM, "n_heads": 4, "ffn_hidden": 256, "vocab": 512, "n_layer": 6}
#: the residual stream between stages: fp32 under autocast
ACTIVATION = BATCH * SEQ * DIM * 4


@pytest.mark.parametrize(("rank", "expected"), [
    (0, TransferBytes(received_activations=0, received_gradients=ACTIVATION, sent_activations=ACTIVATION)),
    (1, TransferBytes(received_activations=ACTIVATION, received_gradients=ACTIVATION, sent_activations=ACTIVATION)),
    (2, TransferBytes(received_activations=ACTIVATION, received_gradients=0, sent_activations=0)),
], ids=["first", "middle", "last"])
def test_a_stage_receives_its_input_and_its_outputs_gradient_and_sends_its_output(rank, expected):
    """The first stage receives no input and the last sends nothing forward nor receives a
    gradient; every one of these is kept from forward into backward by torch's stage."""
    execution = Execution(world=3, pipeline=3, pipeline_schedule="gpipe", micro_batch=BATCH, checkpoint="full")
    request = ModelRequest("llama-7b", batch=BATCH, seq_len=SEQ, overrides=LLAMA)
    figures = rank_cost(request, TraceOptions(amp="bf16"), execution, load_gpu("h100"),
                        load_cluster("dgx-h100"), rank).figures
    assert figures.transfers == expected
    assert figures.transfers.received + figures.transfers.sent_activations <= figures.saved_activations
