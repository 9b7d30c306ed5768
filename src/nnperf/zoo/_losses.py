"""Training losses for zoo workloads.

The targets are created in ``build()`` (under the caller's FakeTensorMode when tracing), and
the loss objects move them to the output's device so a workload moved to a GPU still works.
Callable classes rather than lambdas keep a readable ``repr`` for reports and debugging.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor


class CrossEntropy:
    """``F.cross_entropy`` of logits against fixed random class ids (one per sample)."""

    def __init__(self, targets: Tensor) -> None:
        self.targets = targets

    def __call__(self, output: Any) -> Tensor:
        return F.cross_entropy(output, self.targets.to(output.device))

    def __repr__(self) -> str:
        return f"CrossEntropy(targets={tuple(self.targets.shape)})"


class NllLoss:
    """``F.nll_loss`` for models that end in ``log_softmax`` (the PyTorch MNIST example)."""

    def __init__(self, targets: Tensor) -> None:
        self.targets = targets

    def __call__(self, output: Any) -> Tensor:
        return F.nll_loss(output, self.targets.to(output.device))

    def __repr__(self) -> str:
        return f"NllLoss(targets={tuple(self.targets.shape)})"


class TokenCrossEntropy:
    """Cross entropy over the vocabulary at every position of (B, T, V) logits.

    Used both for next-token prediction (targets play the shifted inputs) and for masked-LM
    over all positions; the cost is the same as with real data.
    """

    def __init__(self, targets: Tensor) -> None:
        self.targets = targets

    def __call__(self, output: Any) -> Tensor:
        logits = output[0] if isinstance(output, tuple | list) else output
        return F.cross_entropy(logits.flatten(0, 1), self.targets.to(logits.device).flatten())

    def __repr__(self) -> str:
        return f"TokenCrossEntropy(targets={tuple(self.targets.shape)})"


class PretrainingLoss:
    """BERT pre-training: masked-LM cross entropy plus next-sentence classification."""

    def __init__(self, mlm_targets: Tensor, nsp_targets: Tensor) -> None:
        self.mlm = TokenCrossEntropy(mlm_targets)
        self.nsp = CrossEntropy(nsp_targets)

    def __call__(self, output: Any) -> Tensor:
        mlm_logits, nsp_logits = output
        return self.mlm(mlm_logits) + self.nsp(nsp_logits)

    def __repr__(self) -> str:
        return f"PretrainingLoss(mlm={self.mlm!r}, nsp={self.nsp!r})"


def random_classes(batch: int, num_classes: int) -> Tensor:
    """Class ids the way a data loader would hand them over: int64, one per sample."""
    return torch.randint(0, num_classes, (batch,), dtype=torch.long)


def random_tokens(batch: int, seq: int, vocab: int) -> Tensor:
    """Token ids of shape (batch, seq), int64, uniformly drawn from the vocabulary."""
    return torch.randint(0, vocab, (batch, seq), dtype=torch.long)
