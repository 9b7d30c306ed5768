"""advise's batch curve from the search's traces (``search.advise.affine``): the trace built at
a batch is the trace taken there, number for number, for steps affine in the batch; steps
that are not (a size rounded up, an op only at some batches) build nothing."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nnperf.hardware import default_profile, load_gpu
from nnperf.passes.timing import TimingOptions
from nnperf.request import ModelRequest
from nnperf.search.advise.affine import analysis_at, interpolate
from nnperf.search.advise.change import Change
from nnperf.search.advise.evaluate import Setup, price, trace_change
from nnperf.search.memory_variants import MemoryOptions
from nnperf.trace.options import TraceOptions

A100 = load_gpu("a100-40gb-sxm")
TINY_GPT = {"n_layer": 1, "n_embd": 64, "n_head": 2, "vocab": 512, "n_positions": 32}


def _setup(model, **trace) -> Setup:  # type: ignore[no-untyped-def]
    request = ModelRequest(model, seq_len=32 if model == "gpt2" else None,
                           overrides=TINY_GPT if model == "gpt2" else {"image_size": 32, "num_classes": 10})
    return Setup(request, MemoryOptions(TraceOptions(**trace)), A100, default_profile(A100), TimingOptions())


def test_built_traces_are_the_traces_taken_at_that_batch():
    for setup in (_setup("gpt2", amp="bf16"), _setup("resnet18", optimizer="sgd"),
                  _setup("gpt2", train=False)):
        taken = {b: trace_change(setup, Change(batch=b)) for b in (2, 9, 10, 3, 6)}
        given = {b: taken[b] for b in (2, 9, 10)}
        for b in (3, 6):
            built = analysis_at(given, b)
            assert built is not None and built.trace == taken[b].trace
            assert (built.workload.samples, built.workload.tokens) == (taken[b].workload.samples,
                                                                       taken[b].workload.tokens)
            assert price(setup, Change(batch=b), built, {}) == price(setup, Change(batch=b), taken[b], {})
        assert interpolate({b: a.trace for b, a in given.items()}, 1) is None  # outside: not built
        assert interpolate({b: a.trace for b, a in given.items()}, 11) is None
        assert interpolate({b: taken[b].trace for b in (2, 10)}, 6) is None  # two traces check nothing
        assert interpolate({b: taken[b].trace for b in (2, 6, 10)}, 3) is None  # none consecutive


class _Padded(nn.Module):
    """Pads the batch to a multiple of 8 (as fused kernels' callers do): sizes off the line."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(F.pad(x, (0, 0, 0, -x.shape[0] % 8)))


class _Branch(nn.Module):
    """One more op from batch 6 on: not the same step at every batch."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        return y * 2.0 if x.shape[0] >= 6 else y


def _traces(model: nn.Module, batches: tuple[int, ...]) -> dict:
    out = {}
    for b in batches:
        setup = Setup(ModelRequest(model, inputs=(torch.randn(b, 16),)), MemoryOptions(), A100,
                      default_profile(A100), TimingOptions())
        out[b] = trace_change(setup, Change()).trace
    return out


def test_steps_off_the_line_build_nothing():
    # two consecutive batches (the search's answer and the next) catch a rounded size
    padded = _traces(_Padded(), (8, 15, 16))
    assert padded[15].events[0].outputs[0].shape == (16, 16)  # 15 rows padded to 16
    assert interpolate(padded, 12) is None
    branch = _traces(_Branch(), (2, 3, 8, 9))
    assert interpolate({b: branch[b] for b in (2, 8, 9)}, 4) is None
    assert interpolate({b: branch[b] for b in (2, 3, 9)}, 4) is None
