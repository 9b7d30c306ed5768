"""What workload to build: the model the user named, and the batch, inputs and settings it is
built with.

``analyze``, ``measure``, ``trace_memory`` and ``fit`` all build the same workload from the
same description, so it is one frozen value they share rather than the same keyword
arguments threaded through each of them: a new way to describe a model's inputs is then added
in one place, and a bad value is rejected once, when the request is made, with the same
message whichever command made it. How the step is run (training or inference, optimizer,
precision) is ``nnperf.trace.capture.TraceOptions``; turning a request into a builder is
``nnperf.loading.resolve``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from nnperf.errors import UsageError
from nnperf.workload import LossFn

INPUT_DTYPES = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
}


@dataclass(frozen=True)
class InputSpec:
    """Inputs for a bare model: explicit shapes, or token ids (batch, seq) below a vocab size."""

    shapes: tuple[tuple[int, ...], ...] = ()
    dtype: str = "fp32"
    tokens: tuple[int, int] | None = None
    vocab: int | None = None

    def build(self) -> tuple[torch.Tensor, ...]:
        if self.tokens is not None:
            b, t = self.tokens
            return (torch.randint(0, self.vocab or 32000, (b, t)),)
        dtype = INPUT_DTYPES[self.dtype]
        if dtype.is_floating_point:
            return tuple(torch.randn(s, dtype=dtype) for s in self.shapes)
        return tuple(torch.randint(0, 2, s, dtype=dtype) for s in self.shapes)

    @property
    def given(self) -> bool:
        return bool(self.shapes) or self.tokens is not None


def parse_shape(text: str) -> tuple[int, ...]:
    """``8,3,224,224`` or ``8x3x224x224`` -> (8, 3, 224, 224); every size must be >= 1."""
    parts = [p.strip() for p in text.strip().replace("x", ",").split(",")]
    try:  # an empty part is an error too: "8,x" is not the shape (8,)
        shape = tuple(int(p) for p in parts)
    except ValueError:
        raise UsageError(f"invalid shape '{text}': expected integers such as 8,3,224,224") from None
    if not shape or any(s < 1 for s in shape):
        raise UsageError(f"invalid shape '{text}': every size must be a positive integer")
    return shape


@dataclass(frozen=True)
class ModelRequest:
    """The model workload to build: ``target`` and what it is built with.

    ``target`` is a zoo name (``"resnet50"``), ``"file.py:factory"``, ``"pkg.mod:factory"`` or
    an ``nn.Module``. ``batch`` and ``seq_len`` size a zoo model (and a factory that takes
    ``batch``, ``seq_len`` or ``seq``); ``overrides`` are a zoo model's config (``n_layer=2``).
    A module, or a factory that returns a bare model, gets ``inputs`` (positional arguments
    of its forward) or inputs built from ``input_spec``. ``loss_fn`` maps the output to the
    loss a training step backpropagates (default: the sum of the floating outputs).

    A setting that would not reach the model is refused when the workload is resolved
    (``nnperf.loading``), never dropped: ``overrides`` or ``seq_len`` for a target that cannot
    take them, a ``batch`` the inputs' first dimension contradicts.
    """

    target: str | nn.Module
    batch: int | None = None
    seq_len: int | None = None
    inputs: Sequence[Any] | torch.Tensor | None = None
    input_spec: InputSpec = field(default_factory=InputSpec)
    loss_fn: LossFn | None = None
    overrides: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.batch is not None and self.batch < 1:
            raise UsageError(f"invalid batch {self.batch}: must be a positive integer")
        if self.seq_len is not None and self.seq_len < 1:
            raise UsageError(f"invalid sequence length {self.seq_len}: must be a positive integer")
