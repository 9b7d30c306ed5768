"""The step with a communication stream beside the compute stream.

``passes.timing`` plays the eager timeline: the host issues ops in order, one device stream
runs the kernels. Distributed engines run their collectives on separate streams: DDP launches
a bucket's all-reduce as soon as its gradients are in it, FSDP2 copies parameters into its
all-gather buffer and gathers them on its own streams (so the next unit's all-gather runs
during this unit's compute: implicit forward prefetch, explicit backward prefetch) and
reduce-scatters gradients while backward goes on. This pass replays the host's issue times
and the kernel times of ``StepTime`` with two streams and the one dependency that matters:
an op waits until every tensor it reads has been produced, on whichever stream. A collective
that finishes after the compute needing it is *exposed*; the wait is charged to its kind.
What is not modelled yet: the slowdown of kernels that overlap communication (shared SMs and
memory bandwidth), several communication streams, and the host cost of the collectives.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from nnperf.passes.timing import StepTime
from nnperf.trace.events import Trace
from nnperf.vocab import Category

#: Copies FSDP2 runs on its all-gather stream, not on the compute stream.
_ON_COMM_STREAM = {"fsdp.all_gather_copy_in"}


@dataclass(frozen=True)
class CommSlice:
    index: int
    kind: str
    bytes: int
    start_s: float
    end_s: float


@dataclass
class CommStep:
    step_s: float
    compute_s: float  # kernel time on the compute stream
    comm_s: float  # collective time on the communication stream
    exposed_s: dict[str, float] = field(default_factory=dict)  # collective kind -> compute waited
    slices: list[CommSlice] = field(default_factory=list)
    #: event index -> when the compute stream is done with everything up to that event (its
    #: clock: an action's time in a pipeline schedule is the difference across its events)
    clock: dict[int, float] = field(default_factory=dict)

    @property
    def exposed_total_s(self) -> float:
        return sum(self.exposed_s.values())


def overlap(
    step: StepTime, trace: Trace, collective_time: Callable[[int], tuple[str, int, float]]
) -> CommStep:
    """Replay ``step`` with collectives on their own stream. ``collective_time(index)`` gives
    the kind, bytes and time of the collective at that event index."""
    issued = {s.index: s.end_s for s in step.host_slices}
    produced: dict[int, tuple[float, str | None]] = {}  # storage -> (ready time, kind if comm)
    compute_free = comm_free = compute_busy = comm_busy = 0.0
    exposed: dict[str, float] = defaultdict(float)
    slices: list[CommSlice] = []
    clock: dict[int, float] = {}
    for t in step.ops:
        clock[t.index] = compute_free
        event = t.count.event
        issue = issued.get(t.index, 0.0)
        ready, waited_on = 0.0, None
        for m in event.inputs:
            when, kind = produced.get(m.storage, (0.0, None))
            if when > ready:
                ready, waited_on = when, kind
        if t.category == Category.COMMUNICATION:
            kind, nbytes, seconds = collective_time(t.index)
            start = max(issue, comm_free, ready)
            comm_free = start + seconds
            comm_busy += seconds
            slices.append(CommSlice(t.index, kind, nbytes, start, comm_free))
            for m in event.inputs + event.outputs:
                produced[m.storage] = (comm_free, kind)
            continue
        if not t.kernels:
            # no kernel (a functional collective's stream wait, an allocation): what it
            # returns is ready when what it reads is, so a reader still waits for the collective
            for m in event.outputs:
                if ready > produced.get(m.storage, (0.0, None))[0]:
                    produced[m.storage] = (ready, waited_on)
            continue
        if event.name in _ON_COMM_STREAM:
            start = max(issue, comm_free, ready)
            comm_free = start + t.kernel_s
            comm_busy += t.kernel_s
            end = comm_free
        else:
            free = max(issue, compute_free)
            start = max(free, ready)
            if start > free and waited_on is not None:
                exposed[waited_on] += start - free
            compute_free = end = start + t.kernel_s
            compute_busy += t.kernel_s
            clock[t.index] = compute_free
        for m in event.outputs:
            produced[m.storage] = (end, None)
    if comm_free > compute_free:  # the step ends when the last collective does
        last = slices[-1].kind if slices else "communication"
        exposed[last] += max(0.0, comm_free - max(compute_free, step.host_s))
    end = max(compute_free, comm_free, step.host_s)
    return CommStep(end, compute_busy, comm_busy, {k: v for k, v in exposed.items() if v > 0}, slices, clock)
