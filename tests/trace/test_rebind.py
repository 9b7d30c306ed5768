"""Rebinding a model's tensors: ties kept, fake tensors accepted, nothing moved twice."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from nnperf.trace.rebind import rebind_tensors


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        self.norm = nn.LayerNorm(4)


def test_cast_keeps_ties_and_leaves_integers():
    model = rebind_tensors(Tied(), dtype=torch.bfloat16)
    assert model.head.weight is model.embed.weight and model.embed.weight.dtype == torch.bfloat16
    assert model.norm.bias.dtype == torch.bfloat16 and model.steps.dtype == torch.long
    assert sum(1 for _ in model.parameters()) == 3  # the tied weight counted once


def test_tensors_already_in_place_are_the_same_objects():
    model = Tied()
    before = model.norm.weight
    rebind_tensors(model, device=torch.device("cpu"), dtype=torch.float32)
    assert model.norm.weight is before


def test_fake_tensors_cast_where_module_to_refuses():
    with FakeTensorMode():
        model = Tied()
        rebind_tensors(model, dtype=torch.float16)
        out = model.head(model.embed(torch.zeros(2, 3, dtype=torch.long)))
    assert out.dtype == torch.float16 and model.head.weight is model.embed.weight


@pytest.mark.skipif(not torch.backends.cuda.is_built(), reason="needs a CUDA build of PyTorch (no GPU needed)")
def test_a_real_step_builds_on_a_fake_cuda_device():
    """What PyTorch's RuntimeEstimator needs: the measured step built under a fake mode on CUDA
    (``Module.to('cuda')`` there failed with 'Cannot swap ... weakref')."""
    from nnperf.loading import resolve
    from nnperf.measure.step import build_step
    from nnperf.request import ModelRequest
    from nnperf.trace.options import TraceOptions

    _, build = resolve(ModelRequest("mlp", batch=4))
    with FakeTensorMode():
        step = build_step(build, TraceOptions(dtype="bf16"), torch.device("cuda"))
        weight = next(step.workload.model.parameters())
        assert weight.device.type == "cuda" and weight.dtype == torch.bfloat16
        inference = build_step(build, TraceOptions(train=False), torch.device("cuda"))
        assert inference.run().device.type == "cuda"  # a backward needs a real device context
