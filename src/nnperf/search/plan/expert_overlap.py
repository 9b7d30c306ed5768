"""What Megatron-Core's expert-parallel overlap saves: one micro-batch's all-to-alls hidden
behind another's compute.

With ``--overlap-moe-expert-parallel-comm`` Megatron-Core runs the backward of one micro-batch
and the forward of the next as one step, layer by layer (``combined_1f1b.py``; Megatron-LM
megatron/core/models/common/model_chunk_schedule_plan.py, ``TransformerLayerSchedulePlan.run``):
the forward's layer ``i`` beside the backward's layer ``L - 1 - i``, each layer cut into its
attention and everything up to the dispatch (``pre_dispatch``, compute), the dispatch
(communication), the experts (``mlp``, compute) and the combine with what follows it
(communication stream), on two streams in this order::

    comm stream:  combine_bwd        | dispatch_fwd -> dispatch_bwd   | combine_fwd
    comp stream:  pre_dispatch_fwd   | mlp_bwd -> mlp_fwd             | pre_dispatch_bwd

The experts' backward waits for the combine's backward, the dispatch for the attention's
forward, the dispatch's backward for the experts' backward, the experts' forward for the
dispatch, the combine for the experts' forward and the attention's backward for the dispatch's
backward; so the two streams meet at the end of each of the four columns, and the layer pair
takes the sum of the columns, each the longer of its two sides (``combined_s``), where one
after the other they take the sum of all eight. While a collective runs beside compute, the
compute runs at the contention's slowdown (``passes.comm_timeline.Contention``), as the
trace's own overlap does.

Each side's time is the traced rank's: the compute stream's clock across the layer's events
(``passes.comm_timeline``), less its waits for that layer's all-to-alls, and each all-to-all's
own time on its stream. What the pair saves against the traced step (one micro-batch's forward
then its backward, the all-to-alls waited for as the trace waited) is
``RankFigures.expert_overlap_s``, additive over the blocks as every figure is; the plan takes
it off each backward the schedule runs beside the next forward (``search.plan.pipeline``,
``search.plan.evaluate``).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from nnperf.passes.comm_timeline import CommStep, Contention
from nnperf.passes.timing import OpTime


@dataclass(frozen=True)
class Side:
    """One column side: compute on the compute stream (``compute_s``, slowed by ``slowdown``
    while a collective runs beside it) or the communication stream's time."""

    compute_s: float = 0.0
    slowdown: float = 1.0


@dataclass(frozen=True)
class LayerPair:
    """One MoE layer's forward (of the next micro-batch) and backward (of this one), cut as
    Megatron-Core cuts them: the forward into attention (everything before the dispatch),
    dispatch, experts and combine, the backward into the combine's, the experts', the
    dispatch's and the attention's backward; compute parts are ``Side``s, communication parts
    seconds. ``serial_s``: the two as the traced step runs them, one after the other."""

    attention_forward: Side
    dispatch_s: float
    experts_forward: Side
    combine_s: float
    combine_backward_s: float
    experts_backward: Side
    dispatch_backward_s: float
    attention_backward: Side
    serial_s: float

    def combined_s(self) -> float:
        """The two run as Megatron-Core's combined step (module docstring)."""
        return (_column(self.attention_forward, self.combine_backward_s)
                + _column(self.experts_backward, self.dispatch_s)
                + _column(self.experts_forward, self.dispatch_backward_s)
                + _column(self.attention_backward, self.combine_s))

    def saved_s(self) -> float:
        """What the combined step saves against the serial one (none where it would cost)."""
        return max(0.0, self.serial_s - self.combined_s())


def _column(compute: Side, comm_s: float) -> float:
    """One column: a collective of ``comm_s`` beside ``compute``, both starting together; the
    compute runs ``compute.slowdown`` times slower while the collective runs."""
    k = max(compute.slowdown, 1.0)
    return max(comm_s, compute.compute_s + comm_s * (1.0 - 1.0 / k))


def _within(module: str, names: dict[str, str]) -> str | None:
    """The value of ``names`` at ``module`` or at the nearest module holding it (None: none)."""
    while module:
        if module in names:
            return names[module]
        module = module.rpartition(".")[0]
    return None


class _Clock:
    """The compute stream's clock at any event of a traced step (``CommStep.clock``)."""

    def __init__(self, comm: CommStep) -> None:
        self.indices = sorted(comm.clock)
        self.times = [comm.clock[i] for i in self.indices]
        self.end = comm.step_s
        self.waits = sorted(comm.waits)

    def at(self, index: int) -> float:
        """When the compute stream reaches event ``index``: its clock at the first op from it on."""
        at = bisect.bisect_left(self.indices, index)
        return self.times[at] if at < len(self.times) else self.end

    def compute(self, start: int, end: int, collectives: set[int]) -> float:
        """The compute stream's time over events ``[start, end)`` less its waits there for
        ``collectives``."""
        first = bisect.bisect_left(self.waits, (start,))  # the waits sorted by op: those in the span
        last = bisect.bisect_left(self.waits, (end,))
        waited = sum(seconds for _op, collective, seconds in self.waits[first:last] if collective in collectives)
        return max(0.0, self.at(end) - self.at(start) - waited)


def layer_pairs(trace: Any, collectives: Sequence[Any], comm: CommStep, ops: Sequence[OpTime],
                contention: Callable[[int], Contention | None], moe_modules: Sequence[str]) -> list[LayerPair]:
    """The traced rank's MoE layers as Megatron-Core pairs them: the forward's ``i``-th MoE layer
    with the backward's ``i``-th (the forward's ``L - 1 - i``-th). ``collectives``: the trace's;
    ``moe_modules``: the names of its mixture-of-experts modules, whose all-to-alls (two or more
    in forward: the dispatch's, the last the combine's; their reverses in backward) cut each
    layer. A layer without all-to-alls (no expert parallelism) is left out."""
    if not moe_modules:
        return []
    clock = _Clock(comm)
    duration = {s.index: s.end_s - s.start_s for s in comm.slices}
    by_index = {t.index: t for t in ops}
    # one pass over the events and one over the collectives: each layer's span per phase (its
    # block's events) and its all-to-alls per phase (its MoE module's), by MoE module
    moe_of_block = {moe.rpartition(".")[0]: moe for moe in moe_modules}
    spans: dict[tuple[str, str], list[int]] = {}
    for e in trace.events:
        moe = _within(e.module, moe_of_block)
        if moe is not None:
            spans.setdefault((moe, e.phase), [e.index, e.index])[1] = e.index
    own = {moe: moe for moe in moe_modules}
    a2a: dict[tuple[str, str], list[int]] = {}
    for c in collectives:
        moe = _within(c.module, own) if c.kind == "all_to_all" else None
        if moe is not None:
            a2a.setdefault((moe, c.phase), []).append(c.index)
    forward: list[tuple[list[int], int, int]] = []
    backward: list[tuple[list[int], int, int]] = []
    for (moe, phase), (first, last) in spans.items():
        cuts = sorted(a2a.get((moe, phase), ()))
        if phase in ("forward", "backward") and len(cuts) >= 2:
            (forward if phase == "forward" else backward).append((cuts, first, last + 1))
    backward.sort(key=lambda layer: layer[1])  # in the order backward runs them
    forward.sort(key=lambda layer: layer[1])

    def slowdown(start: int, end: int, collective: int) -> float:
        """How much slower the compute ops of ``[start, end)`` run beside ``collective``."""
        taken = contention(collective)
        timed = [by_index[i] for i in range(start, end) if i in by_index and by_index[i].kernel_s > 0]
        alone = sum(t.kernel_s for t in timed)
        if taken is None or not alone:
            return 1.0
        return sum(t.kernel_s * taken.slowdown(t) for t in timed) / alone

    pairs = []
    for (f_a2a, f_start, f_end), (b_a2a, b_start, b_end) in zip(forward, backward, strict=False):
        f_set, b_set = set(f_a2a), set(b_a2a)
        dispatch, combine = f_a2a[0], f_a2a[-1]
        combine_back, dispatch_back = b_a2a[0], b_a2a[1]
        pairs.append(LayerPair(
            attention_forward=Side(clock.compute(f_start, dispatch, f_set), slowdown(f_start, dispatch, combine_back)),
            dispatch_s=sum(duration.get(i, 0.0) for i in f_a2a[:-1]),
            experts_forward=Side(clock.compute(dispatch, combine, f_set), slowdown(dispatch, combine, dispatch_back)),
            # the combine's node holds what follows it in the layer (unpermutation, residual)
            combine_s=duration.get(combine, 0.0) + clock.compute(combine, f_end, f_set),
            combine_backward_s=clock.compute(b_start, combine_back, b_set) + duration.get(combine_back, 0.0),
            experts_backward=Side(clock.compute(combine_back, dispatch_back, b_set),
                                  slowdown(combine_back, dispatch_back, dispatch)),
            dispatch_backward_s=sum(duration.get(i, 0.0) for i in b_a2a[1:]),
            attention_backward=Side(clock.compute(dispatch_back, b_end, b_set), slowdown(dispatch_back, b_end, combine)),
            serial_s=clock.at(f_end) - clock.at(f_start) + clock.at(b_end) - clock.at(b_start),
        ))
    return pairs


def expert_overlap_saving(trace: Any, collectives: Sequence[Any], comm: CommStep, ops: Sequence[OpTime],
                          contention: Callable[[int], Contention | None], moe_modules: Sequence[str]) -> float:
    """What running the traced micro-batch's backward beside the next one's forward saves
    (``layer_pairs``, summed)."""
    return sum(p.saved_s() for p in layer_pairs(trace, collectives, comm, ops, contention, moe_modules))


def hidden_all_to_alls(exposed: dict[str, float], hidden: float) -> dict[str, float]:
    """The exposed communication by kind (a step's split) with what the overlap ``hidden``
    taken off the all-to-alls' (what it saves is their waits, less the compute they slow)."""
    if not hidden or "all_to_all" not in exposed:
        return exposed
    return {**exposed, "all_to_all": max(0.0, exposed["all_to_all"] - hidden)}
