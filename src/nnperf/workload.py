"""What gets traced or measured: a model, its example inputs and how to turn outputs into a loss.

Both the zoo and user factories produce a ``Workload`` so that tracing, prediction and
measurement never need to know where a model came from.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

LossFn = Callable[[Any], torch.Tensor]


@dataclass
class Workload:
    """A model plus everything needed to run one step of it.

    ``inputs`` are positional arguments to ``model(*inputs)``. ``loss_fn`` maps the
    model output to a scalar; when absent the sum of all floating outputs is used.
    ``samples`` and ``tokens`` count what one step processes, for throughput figures.
    """

    model: nn.Module
    inputs: tuple[Any, ...]
    loss_fn: LossFn | None = None
    samples: int = 1
    tokens: int | None = None
    name: str = "model"
    info: dict[str, Any] = field(default_factory=dict)


def default_loss(output: Any) -> torch.Tensor:
    """Sum every floating-point tensor in the output, so any model has a scalar to backprop."""
    tensors = [t for t in _flatten(output) if t.is_floating_point()]
    if not tensors:
        raise ValueError("the model output contains no floating-point tensor to build a loss from")
    loss = tensors[0].sum()
    for t in tensors[1:]:
        loss = loss + t.sum()
    return loss


def _flatten(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _flatten(v)]
    if isinstance(obj, Sequence) and not isinstance(obj, str):
        return [t for v in obj for t in _flatten(v)]
    if hasattr(obj, "__dict__") and hasattr(obj, "keys"):  # ModelOutput-like mappings
        return [t for k in obj.keys() for t in _flatten(obj[k])]  # noqa: SIM118 (not a dict)
    return []
