"""Which ZeRO-1 rank a plan reports: the one that sets the step's pace and peak memory.

Under ZeRO-1 (DDP with ``ZeroRedundancyOptimizer``) every rank holds the whole parameters and
gradients, but only its share of the optimizer state, and updates only that share before it
broadcasts it. PyTorch hands the parameters out largest first, each to the rank with the fewest
elements so far (``_partition_parameters``), so shares differ: a step waits for the rank with
the most elements to update and broadcast, and that rank holds the most memory.

- A model traced whole: the trace records every rank's share (``trace.config``'s
  ``optimizer_shares``); the plan traces the busiest rank (``busiest_rank``).
- A deep stack extrapolated from shallow traces (``plan.rank.scaled_cost``): a shallow stack
  has few parameters, so the busiest rank may hold just the embedding, and a line through two
  such shares says nothing of the deep stack's. The average share grows by the same amount per
  block, though: each shallow trace is turned into the average rank (``to_average``), the line
  read at the real depth, and that average turned into the busiest rank of the deep stack
  (``to_busiest``): the larger of the largest parameter (the first one handed out, to rank 0,
  which takes nothing more while the others' shares stay below it) and the average (largest
  first, so what is handed out last, and leaves ranks apart, is the smallest: a bias or a norm's
  weight). GPT-2 on 8 ranks: rank 0 holds the token embedding alone, 38.6 M elements against an
  average of 15.5 M.
- Turning a traced rank into another share scales by the ratio of the elements its update
  kernels, its optimizer state and the temporaries its update allocates (AdamW's foreach
  update: a square root of the second moments per element, ``optimizer_transient_bytes``); the
  step, the compute and the once-per-step tail (``once_span_s``) move by the time, every phase's
  memory by the state, the optimizer phase's by the temporaries too. The host's time to
  issue the update stays the traced rank's: right for the foreach and fused updates (a few
  launches whatever the share holds), short for ``--optimizer-impl single``, whose per-tensor
  launches a deep share has more of than the traced one.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from nnperf.vocab import Category, Phase

if TYPE_CHECKING:
    from nnperf.passes.timing import StepTime
    from nnperf.search.plan.results import RankCost
    from nnperf.trace.events import Trace


def busiest_rank(cost: RankCost) -> int:
    """The rank whose optimizer share holds the most elements (the lowest such rank)."""
    shares = cost.optimizer_shares
    return max(range(len(shares)), key=lambda r: (shares[r], -r)) if shares else 0


def to_average(cost: RankCost) -> RankCost:
    """``cost``, a traced ZeRO-1 rank, as the rank holding the average optimizer share."""
    shares = cost.optimizer_shares
    if cost.rank is None or not shares or not shares[cost.rank]:  # rank 0 holds one: the largest parameter
        raise AssertionError(f"ZeRO-1 rank {cost.rank} traced without an optimizer share")
    return replace(_rescaled(cost, shares[cost.rank], sum(shares) / len(shares)), rank=None)


def to_busiest(cost: RankCost) -> RankCost:
    """``cost``, the average rank of a deep stack (``to_average``, extrapolated), as its busiest."""
    average = cost.figures.optimizer_share
    busiest = _rescaled(cost, average, max(average, float(cost.largest_parameter)))
    # rank 0 takes the largest parameter; where that outweighs the average it takes nothing else
    return replace(busiest, rank=0 if cost.largest_parameter >= average else None)


def optimizer_update_s(step: StepTime) -> float:
    """The update's kernel time alone (not clipping's, nor the broadcasts after it): what a
    rank's share scales."""
    return sum(t.kernel_s for t in step.ops if t.phase == Phase.OPTIMIZER and t.category != Category.COMMUNICATION)


def optimizer_transient_bytes(trace: Trace) -> float:
    """The most bytes the optimizer step's own temporaries hold at once: storages its ops
    allocate, until they are released."""
    live = peak = 0
    made: set[int] = set()
    for event in trace.events:
        if event.phase != Phase.OPTIMIZER:
            continue
        for sid in event.allocates:
            made.add(sid)
            live += trace.storages[sid].nbytes
        peak = max(peak, live)
        live -= sum(trace.storages[sid].nbytes for sid in event.releases if sid in made)
    return float(peak)


def _rescaled(cost: RankCost, elements: float, to: float) -> RankCost:
    factor = to / elements
    f = replace(cost.figures, memory_by_phase=dict(cost.figures.memory_by_phase),
                states=replace(cost.figures.states))
    extra_s = (factor - 1) * f.optimizer_update_s
    extra_bytes = (factor - 1) * f.states.optimizer_state
    extra_transient = (factor - 1) * f.optimizer_transient
    f.step_s += extra_s
    f.compute_s += extra_s
    f.optimizer_s += extra_s
    f.optimizer_update_s += extra_s
    f.once_span_s += extra_s
    phases = f.memory_by_phase
    for phase in phases:
        phases[phase] += extra_bytes
    f.model_states += extra_bytes
    f.states.optimizer_state += extra_bytes
    if Phase.OPTIMIZER in phases:
        phases[Phase.OPTIMIZER] += extra_transient
    # the step's peak: the highest phase (plan.rank.extrapolate's rule)
    f.memory = max(phases.values()) + f.mem_outside if phases else f.memory + extra_bytes
    f.optimizer_transient += extra_transient
    f.optimizer_share = to
    return replace(cost, figures=f)
