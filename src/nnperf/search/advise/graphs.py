"""CUDA graphs: replay the whole step with one launch when the host cannot keep up.

In eager mode the host dispatches every op (``passes.timing``); a host-bound step leaves the
device idle between kernels. Replayed from a graph the kernels run back to back: the step
becomes one launch plus the device's busy time. What a graph cannot capture is read from
the trace: ``.item()`` and other host syncs, and ops whose output shape depends on data.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from nnperf.passes.timing import StepTime, _syncs
from nnperf.search.advise.change import Candidate, Change

if TYPE_CHECKING:
    from nnperf.hardware import DeviceProfile
    from nnperf.search.advise.evaluate import Base

#: aten ops whose output shape depends on tensor values (a graph needs static shapes).
DYNAMIC_SHAPE_OPS = frozenset({
    "aten.nonzero", "aten.masked_select", "aten.unique_consecutive", "aten._unique2", "aten.unique_dim",
    "aten.repeat_interleave", "aten.nonzero_static",
})
#: The idle share of the step from which a graph is worth offering.
HOST_BOUND_SHARE = 0.05


def blockers(base: Base) -> list[str]:
    """What stops capture, found in the trace (each with its module)."""
    trace = base.analysis.trace
    found: dict[str, int] = {}
    for ev in trace.events:
        if _syncs(ev, trace):
            key = f".item() / host sync in {ev.module or '(model)'} ({ev.phase})"
        elif ev.name in DYNAMIC_SHAPE_OPS:
            key = f"data-dependent shape: {ev.name} in {ev.module or '(model)'}"
        else:
            continue
        found[key] = found.get(key, 0) + 1
    return [f"{k} x{n}" if n > 1 else k for k, n in found.items()]


def candidates(base: Base) -> list[Candidate]:
    step = base.prediction.step
    idle = step.step_s - step.device_busy_s
    if step.bound != "host" and idle < HOST_BOUND_SHARE * step.step_s:
        base.checked.append(("cuda-graphs", f"the step is {step.bound}-bound with the device idle "
                                            f"{idle / step.step_s:.1%} of it: a graph would hide little"))
        return []
    found = blockers(base)
    optimizer = base.options.trace.optimizer if base.options.trace.train else None
    how = "g = torch.cuda.CUDAGraph(); with torch.cuda.graph(g): step()  ...  g.replay()"
    if optimizer in ("adam", "adamw"):
        how += f"  (torch.optim.{'AdamW' if optimizer == 'adamw' else 'Adam'}(..., capturable=True))"
    return [Candidate(
        name="cuda-graphs", family="graphs", title="replay the step as a CUDA graph",
        change=Change(graphs=True), how=how, layers=["the whole step"],
        assumptions=[
            "the replay costs one launch, taken as the profile's eager dispatch of one op (an upper "
            "bound on cudaGraphLaunch); each kernel keeps its device-side overhead",
            "static input shapes and addresses: inputs are copied into the captured buffers",
        ] + ([f"gain only once these are removed: {'; '.join(found)}"] if found else []),
        extra={"blockers": found},
    )]


def replay(step: StepTime, profile: DeviceProfile) -> StepTime:
    """The step replayed from a graph: one launch, then every kernel back to back."""
    launch = profile.host_dispatch_s
    return replace(step, step_s=launch + step.device_busy_s, host_s=launch,
                   bound=_device_bound(step))


def _device_bound(step: StepTime) -> str:
    by: dict[str, float] = {}
    for t in step.ops:
        if t.kernels:
            by[t.kernel_bound] = by.get(t.kernel_bound, 0.0) + t.kernel_s
    by.pop("none", None)
    return max(by, key=by.get) if by else "launch"
