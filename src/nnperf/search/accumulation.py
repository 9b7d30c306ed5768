"""What gradient accumulation repeats of a traced step, and what it runs once.

A traced step is one micro-batch with the optimizer. Accumulating ``n`` micro-batches repeats
forward and backward ``n`` times and runs the once-per-step ops (``trace.step.once_per_step``:
gradient clipping, the optimizer) once; ``plan`` and ``advise`` both need the wall time those
ops add to a step that one more micro-batch would not.

Also here: how a global batch splits into ranks, micro-batches and accumulation steps
(``BatchSplit``), the one rule both commands use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from nnperf.errors import UsageError
from nnperf.passes.comm_timeline import CommStep
from nnperf.passes.timing import StepTime
from nnperf.trace.step import once_per_step


def once_span(step: StepTime, comm: CommStep | None = None) -> float:
    """The step less the wall time each further micro-batch adds. On a host-bound step (no
    collective exposed) that is the host's dispatch of the once-per-step ops: the next
    micro-batch's dispatch overlaps the device's last kernels. Otherwise it is the tail from
    where the compute stream stood when the first of them was reached: on ``comm``'s timeline
    (collectives included) where there is one, else at the end of the device work before it."""
    once = [i for i, t in enumerate(step.ops) if once_per_step(t.count.event)]
    if not once:
        return 0.0
    end = comm.step_s if comm is not None else step.step_s
    if step.bound == "host" and not (comm is not None and comm.exposed_s):
        return end - (step.host_s - sum(step.ops[i].host_s for i in once))
    if comm is not None:  # the clock after the op before the first (the first's own: after it)
        return end - (comm.clock.get(step.ops[once[0] - 1].index, end) if once[0] else 0.0)
    return end - max((t.end_s for t in step.ops[:once[0]]), default=0.0)


@dataclass(frozen=True)
class BatchSplit:
    """A global batch as data-parallel ranks x micro-batch x accumulation steps, exactly: the
    one rule ``plan`` and ``advise`` split a ``--global-batch`` by, so a split one accepts the
    other accepts too and a printed split adds up to the batch asked for."""

    global_batch: int
    ranks: int
    micro_batch: int
    steps: int

    def __post_init__(self) -> None:
        if self.ranks * self.micro_batch * self.steps != self.global_batch:
            raise ValueError(f"{self.ranks} x {self.micro_batch} x {self.steps} is not {self.global_batch}")

    @classmethod
    def of(cls, global_batch: int, ranks: int, micro_batch: int) -> BatchSplit:
        """The split with micro-batches of ``micro_batch`` (one of ``micro_batches``)."""
        local = local_batch(global_batch, ranks)
        return cls(global_batch, ranks, micro_batch, local // micro_batch)


def nearest_multiples(value: int, step: int) -> str:
    """The multiples of ``step`` either side of ``value``, as a refusal names them ("8 or 16";
    only the upper one when the lower is 0)."""
    low, high = value // step * step, (value // step + 1) * step
    return f"{low} or {high}" if low else str(high)


def local_batch(global_batch: int, ranks: int) -> int:
    """Each data-parallel rank's share of the global batch; an uneven share is one line with
    the nearest global batches that split evenly."""
    if global_batch % ranks:
        raise UsageError(f"--global-batch {global_batch} does not divide over {ranks} data-parallel ranks; "
                         f"nearest global batches that do: {nearest_multiples(global_batch, ranks)}")
    return global_batch // ranks


def micro_batches(local: int, largest: int | None = None) -> list[int]:
    """Every micro-batch that splits a rank's ``local`` samples evenly (its divisors, down to
    one), ascending; ``largest``: only those up to it (the largest that fits)."""
    small = [d for d in range(1, math.isqrt(local) + 1) if local % d == 0]
    found = sorted(set(small + [local // d for d in small]))
    return [d for d in found if largest is None or d <= largest]
