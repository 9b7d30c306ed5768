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

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from nnperf.errors import UsageError, shown
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


@dataclass(frozen=True)
class IntLimit:
    """The integers an input may be: ``low`` to ``high`` inclusive."""

    low: int
    high: int

    def check(self, value: int, what: str) -> int:
        """``value``, or a usage error naming ``what`` and the valid range."""
        if isinstance(value, bool) or not isinstance(value, int) or not self.low <= value <= self.high:
            text = str(value) if isinstance(value, int) and len(str(value)) <= 40 else shown(value)
            raise UsageError(f"invalid {what} {text}: expected {self.describe()}")
        return value

    def describe(self) -> str:
        return f"an integer from {self.low:,} to {self.high:,}"


#: Largest batch, sequence length, input dimension or vocabulary: 2**31 - 1. Larger values
#: are typos (no GPU holds 2**31 samples of anything), and beyond them the element counts
#: of a step overflow the 64-bit sizes PyTorch computes with (2**31 samples x 2**31 positions
#: x 2**31 features already does).
INDEX_MAX = 2**31 - 1
#: The most elements one input tensor may have: 2**48 (512 TiB of fp16), far beyond any
#: device, well inside PyTorch's 64-bit sizes once a model multiplies it by its widths.
MAX_INPUT_ELEMENTS = 2**48

#: The valid range of every integer the CLI takes, in one place: the options' types
#: (``nnperf.cli.limits``) and ``ModelRequest`` both check these.
LIMITS: dict[str, IntLimit] = {
    "batch": IntLimit(1, INDEX_MAX),
    "seq": IntLimit(1, INDEX_MAX),
    "dim": IntLimit(1, INDEX_MAX),  # one size of --input-shape / --tokens
    "vocab": IntLimit(1, INDEX_MAX),
    "max_batch": IntLimit(1, INDEX_MAX),
    "grad_accum": IntLimit(1, 2**20),
    "depth": IntLimit(0, 1000),  # module tree depth shown
    "rows": IntLimit(1, 100_000),  # printed timeline rows
    "timeline_points": IntLimit(0, 100_000_000),
    "steps": IntLimit(1, 1_000_000),
    "warmup": IntLimit(0, 1_000_000),
    "repeats": IntLimit(1, 10_000),
    "gemm_dim": IntLimit(1, INDEX_MAX),  # M, N, K of nnperf gemm
    "gemm_batch": IntLimit(1, INDEX_MAX),
    "transfer_n": IntLimit(1, 65_536),  # n of an n x n product nnperf bench runs for real
}


def parse_shape(text: str, what: str = "shape") -> tuple[int, ...]:
    """``8,3,224,224`` or ``8x3x224x224`` -> (8, 3, 224, 224); every size 1..2**31-1 and at
    most ``MAX_INPUT_ELEMENTS`` elements in all."""
    parts = [p.strip() for p in text.strip().replace("x", ",").split(",")]
    try:  # an empty part is an error too: "8,x" is not the shape (8,)
        shape = tuple(int(p) for p in parts)
    except ValueError:
        raise UsageError(f"invalid {what} {shown(text)}: expected integers such as 8,3,224,224") from None
    dim = LIMITS["dim"]
    if not shape or any(not dim.low <= s <= dim.high for s in shape):
        raise UsageError(f"invalid {what} {shown(text)}: every size must be {dim.describe()}")
    if math.prod(shape) > MAX_INPUT_ELEMENTS:
        raise UsageError(f"invalid {what} {shown(text)}: {math.prod(shape):,} elements; at most "
                         f"2**48 = {MAX_INPUT_ELEMENTS:,}")
    return shape


@dataclass(frozen=True)
class ModelRequest:
    """The model workload to build: ``target`` and what it is built with.

    ``target`` is a zoo name (``"resnet50"``), a library model (``"hf:gpt2"``,
    ``"timm:convnext_tiny"``, ``"tv:resnet50"``), ``"file.py:factory"``, ``"pkg.mod:factory"`` or
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
    #: A Hugging Face model's task head and attention implementation (``hf:`` targets only).
    task: str | None = None
    attn_implementation: str | None = None

    def __post_init__(self) -> None:
        if self.batch is not None:
            LIMITS["batch"].check(self.batch, "batch")
        if self.seq_len is not None:
            LIMITS["seq"].check(self.seq_len, "sequence length")


def model_label(name: str, overrides: Mapping[str, Any] | None = None) -> str:
    """The model as a table header names it: with the config changes of ``-O`` (``llama-7b
    (n_layer=2)``), so a saved table is not read as the full model's."""
    if not overrides:
        return name
    return f"{name} ({', '.join(f'{k}={_option_text(v)}' for k, v in overrides.items())})"


def _option_text(value: Any) -> str:
    """A ``-O`` value as the user writes it: ``true``, not ``True``."""
    return str(value).lower() if isinstance(value, bool) else str(value)
