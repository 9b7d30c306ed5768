"""A plain multi-layer perceptron: the smallest workload, handy for checking the tooling."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from nnperf.errors import ModelOptionError
from nnperf.workload import Workload

from ._losses import CrossEntropy, random_classes
from ._options import resolve_batch_seq, resolve_options
from ._spec import ModelSpec

DEFAULTS: dict[str, Any] = {"widths": "784,1024,1024,10"}


class MLP(nn.Sequential):
    """Linear layers with ReLU between them (none after the last, which gives logits)."""

    def __init__(self, widths: Sequence[int]) -> None:
        layers: list[nn.Module] = []
        for i, (n_in, n_out) in enumerate(itertools.pairwise(widths)):
            layers.append(nn.Linear(n_in, n_out))
            if i < len(widths) - 2:
                layers.append(nn.ReLU())
        super().__init__(*layers)


def parse_widths(value: Any) -> list[int]:
    """Accept "784,1024,10" (command line) or a list of ints (Python)."""
    items = value.replace("x", ",").split(",") if isinstance(value, str) else list(value)
    try:
        widths = [int(str(w).strip()) for w in items if str(w).strip()]
    except ValueError:
        raise ModelOptionError(
            f"mlp: widths must be integers like '784,1024,10', got {value!r}"
        ) from None
    if len(widths) < 2 or min(widths) < 1:
        raise ModelOptionError(f"mlp: widths needs at least two positive sizes, got {value!r}")
    return widths


def build(batch: int | None = None, seq_len: int | None = None, **overrides: Any) -> Workload:
    """An MLP on (batch, widths[0]) inputs, cross entropy over widths[-1] classes."""
    batch, _ = resolve_batch_seq("mlp", batch, seq_len, SPEC.default_batch, None)
    config = resolve_options("mlp", overrides, DEFAULTS)
    widths = parse_widths(config["widths"])
    config["widths"] = widths
    model = MLP(widths)
    x = torch.randn(batch, widths[0])
    loss = CrossEntropy(random_classes(batch, widths[-1]))
    info = {"num_classes": widths[-1], "config": config}
    return Workload(model, (x,), loss, samples=batch, name="mlp", info=info)


SPEC = ModelSpec(
    name="mlp",
    summary="MLP 784-1024-1024-10 with ReLU (widths configurable)",
    family="mlp",
    default_batch=64,
    default_seq=None,
    input_desc="784 float features",
    options={"widths": "layer widths, input first, e.g. '784,1024,1024,10'"},
    build=build,
)
