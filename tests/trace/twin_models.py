"""Two copies of a tiny built-in Llama with the same weights and targets, the first few targets
ignored (-100): the loss tests run one as written and the other split (over ranks, or into
pipeline stages) and compare the loss and every gradient."""

from __future__ import annotations

from typing import Any

import torch


def twin_llamas(config: dict[str, Any], batch: int = 2, seq: int = 8) -> tuple[Any, Any]:
    from nnperf.zoo.llama import build

    torch.manual_seed(0)
    reference = build(batch, seq, **config)
    twin = build(batch, seq, **config)
    twin.model.load_state_dict(reference.model.state_dict())
    reference.loss_fn.targets[0, :3] = -100  # ignored targets: no loss, no gradient
    twin.loss_fn.targets.copy_(reference.loss_fn.targets)
    return reference, twin
