"""Assemble a ``Workload`` from a built model, so every family fills ``info`` the same way."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from nnperf.errors import ModelOptionError
from nnperf.workload import LossFn, Workload

from ._losses import CrossEntropy, random_classes


def image_workload(
    name: str,
    model: nn.Module,
    batch: int,
    image_size: int,
    num_classes: int,
    config: dict[str, Any],
    channels: int = 3,
    loss_fn: LossFn | None = None,
) -> Workload:
    """A (batch, channels, size, size) float input and cross entropy against random labels."""
    x = torch.randn(batch, channels, image_size, image_size)
    if loss_fn is None:
        loss_fn = CrossEntropy(random_classes(batch, num_classes))
    info = {"image_size": image_size, "num_classes": num_classes, "config": dict(config)}
    return Workload(model, (x,), loss_fn, samples=batch, name=name, info=info)


def token_workload(
    name: str,
    model: nn.Module,
    tokens: torch.Tensor,
    loss_fn: LossFn,
    config: dict[str, Any],
) -> Workload:
    """A (batch, seq) int64 token input; ``tokens`` in the workload counts batch*seq."""
    batch, seq = tokens.shape
    info = {"seq_len": int(seq), "vocab": config.get("vocab"), "config": dict(config)}
    return Workload(
        model, (tokens,), loss_fn, samples=int(batch), tokens=int(batch * seq), name=name, info=info
    )


def require_image_size(name: str, image_size: int, minimum: int) -> None:
    """Small images shrink to nothing inside the network; fail early with the smallest size."""
    if image_size < minimum:
        raise ModelOptionError(f"{name}: image_size must be at least {minimum}, got {image_size}")
