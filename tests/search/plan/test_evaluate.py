"""One layout through search.plan.evaluate: a pipeline whose stages cannot split the layers evenly
is refused for every caller, and its shortened first and last stages are modelled as asked (issue
37: a 10-layer GPT-2 on 4 stages gave exactly the 8-layer result)."""

from __future__ import annotations

import pytest
import torch

from nnperf.errors import UsageError
from nnperf.hardware.catalog import load_gpu
from nnperf.hardware.cluster import load_cluster
from nnperf.layout import Execution
from nnperf.request import ModelRequest
from nnperf.search.plan import evaluate
from nnperf.search.plan.rank import RoleCache
from nnperf.trace.options import TraceOptions
from nnperf.zoo import get_model

GPU, CLUSTER = load_gpu("h100"), load_cluster("dgx-h100")
GPT2 = {"n_layer": 10, "n_embd": 64, "n_head": 2, "vocab": 256, "n_positions": 64}
OPTIONS = TraceOptions(amp="bf16")
FOUR = Execution(world=4, pipeline=4, pipeline_schedule="1f1b", micro_batch=1, grad_accum=4)


def test_ten_layers_on_four_even_stages_are_refused():
    request = ModelRequest("gpt2", batch=4, seq_len=32, overrides=GPT2)
    with pytest.raises(UsageError, match="10 layers do not split evenly into 4 pipeline stages"):
        evaluate(request, OPTIONS, FOUR, GPU, CLUSTER, layers=10, cache=RoleCache())


def test_shortened_first_and_last_stages_hold_every_block():
    """2, 3, 3 and 2 blocks: each rank's parameters are its blocks' (and the embeddings', the
    final norm's and the head's on the ends), counted here from the model itself, in fp32."""
    request = ModelRequest("gpt2", batch=4, seq_len=32, overrides=GPT2)
    uneven = FOUR.__class__(**{**FOUR.__dict__, "first_stage_layers": 2, "last_stage_layers": 2})
    planned = evaluate(request, OPTIONS, uneven, GPU, CLUSTER, layers=10, cache=RoleCache())
    with torch.device("meta"):
        model = get_model("gpt2").build(batch=1, seq_len=32, **GPT2).model

    def size(*modules):
        return 4 * sum(p.numel() for m in modules for p in m.parameters())

    block = size(model.h[0])
    expected = {0: size(model.wte, model.wpe) + 2 * block, 1: 3 * block, 2: 3 * block,
                3: 2 * block + size(model.ln_f) + 4 * model.lm_head.weight.numel()}
    assert planned.pipeline.parameter_bytes_per_rank == expected
    assert planned.fits and planned.step_s > 0
