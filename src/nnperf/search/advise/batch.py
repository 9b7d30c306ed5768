"""Batch size: the throughput curve up to the largest batch that fits, its knee, and gradient
accumulation to reach a target global batch.

Each point of the curve is a traced step at that batch (small batches come out host-bound,
GEMMs quantize into waves), the largest batch comes from ``search.fit``. The knee is the
smallest batch within ``KNEE_SHARE`` of the best throughput: past it, a larger batch buys
little speed for its memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nnperf.search.accumulation import BatchSplit, local_batch, micro_batches
from nnperf.search.advise.change import Candidate, Change, Outcome

if TYPE_CHECKING:
    from nnperf.search.advise.evaluate import Base

KNEE_SHARE = 0.9  # of the best throughput on the curve
MAX_POINTS = 6  # traced batches on the curve (besides the given one)


def applies(base: Base) -> bool:
    """A batch the workload can change: not fixed by --input-shape/--tokens."""
    return not base.setup.request.input_spec.given and base.setup.request.inputs is None


def curve_batches(largest: int, given: int) -> list[int]:
    """Up to MAX_POINTS batches from 1 to ``largest`` (powers of two, and ``largest``)."""
    points = {largest}
    b = largest
    while b > 1 and len(points) < MAX_POINTS:
        b = 2 ** (math.ceil(math.log2(b)) - 1)
        points.add(max(1, b))
    return sorted(p for p in points if p != given)


def knee(curve: dict[int, Outcome]) -> int:
    best = max(o.throughput for o in curve.values())
    return min(b for b, o in curve.items() if o.throughput >= KNEE_SHARE * best)


def candidates(base: Base, curve: dict[int, Outcome], largest: int) -> list[Candidate]:
    """The knee and the fastest batch, where they differ from the batch as given."""
    given = base.outcome.samples
    fastest = max(curve, key=lambda b: curve[b].throughput)
    picks = {knee(curve): "the knee of the throughput curve", fastest: "the highest throughput"}
    out = []
    for b, why in sorted(picks.items()):
        if b == given:
            continue
        out.append(Candidate(
            name=f"batch-{b}", family="batch", title=f"batch size {b} ({why}; largest that fits: {largest})",
            change=Change(batch=b), how=f"--batch {b}  (DataLoader(..., batch_size={b}))",
            layers=["the whole step"],
            assumptions=["per-sample speed only: a different batch changes the optimization "
                         "(learning rate, steps per epoch), which is not predicted"],
        ))
    return out


@dataclass(frozen=True)
class Accumulation:
    """A global batch reached by accumulating micro-batches on one GPU, and its optimizer step's time."""

    split: BatchSplit
    time_s: float

    @property
    def samples_per_s(self) -> float:
        return self.split.global_batch / self.time_s

    def to_json(self) -> dict[str, float]:
        s = self.split
        return {"global_batch": s.global_batch, "micro_batch": s.micro_batch, "accumulation_steps": s.steps,
                "samples": s.global_batch, "time_s": self.time_s, "samples_per_s": self.samples_per_s}


def accumulation(global_batch: int, micro: int, outcome: Outcome) -> Accumulation:
    """Micro-batches of ``micro`` (a divisor of ``global_batch``: ``BatchSplit``'s rule, as
    ``plan`` splits) accumulated to ``global_batch``: forward and backward each micro-batch,
    the optimizer once."""
    split = BatchSplit.of(global_batch, 1, micro)
    return Accumulation(split, split.steps * outcome.step_s - (split.steps - 1) * outcome.optimizer_s)


def accumulation_micro_batches(global_batch: int, largest: int) -> list[int]:
    """The micro-batches that reach ``global_batch`` exactly on one GPU and fit (at most
    ``largest``), ascending."""
    return micro_batches(local_batch(global_batch, 1), largest)
