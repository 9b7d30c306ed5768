"""What gradient accumulation repeats of a traced step, and what it runs once.

A traced step is one micro-batch with the optimizer. Accumulating ``n`` micro-batches repeats
forward and backward ``n`` times and runs the once-per-step ops (``trace.step.once_per_step``:
gradient clipping, the optimizer) once; ``plan`` and ``advise`` both need the wall time those
ops add to a step that one more micro-batch would not.
"""

from __future__ import annotations

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
    if comm is not None:
        return end - comm.clock.get(step.ops[once[0]].index, end)
    return end - max((t.end_s for t in step.ops[:once[0]]), default=0.0)
