"""torch's own lowering of an interleaved 1F1B schedule under FSDP, walked action by action: what
a rank's other chunks hold gathered (``_add_unshard_reshard``: from UNSHARD to RESHARD) and with
an accumulated gradient (from a stage's first backward to its ``_add_reduce_grad`` REDUCE_GRAD) at
each of its backwards. The tests' independent account of ``plan.pipeline.unsharded_extra``."""

from __future__ import annotations

from torch.distributed.pipelining.schedules import (
    FULL_BACKWARD,
    REDUCE_GRAD,
    RESHARD,
    UNSHARD,
    ScheduleInterleaved1F1B,
    _add_reduce_grad,
    _add_unshard_reshard,
)


def most_held(pipeline: int, virtual: int, micro: int, rank: int, gathered: float, gradient: float) -> float:
    """The most bytes the rank's other chunks (not the one running its backward, not the rank's
    first, whose trace holds its own) hold at any backward, each chunk ``gathered`` bytes while
    gathered and ``gradient`` bytes while its gradient accumulates."""
    plan = ScheduleInterleaved1F1B.__new__(ScheduleInterleaved1F1B)
    plan.pp_group_size, plan.n_local_stages, plan._n_microbatches = pipeline, virtual, micro
    plan.number_of_rounds = max(1, micro // pipeline)
    plan.microbatches_per_round = micro // plan.number_of_rounds
    compute = plan._calculate_single_rank_operations(rank)
    held_gathered: set[int] = set()
    held_gradients: set[int] = set()
    most = 0.0
    for action in _add_reduce_grad(_add_unshard_reshard(compute), micro):
        kind, stage = action.computation_type, action.stage_index
        if kind == UNSHARD:
            held_gathered.add(stage)
        elif kind == RESHARD:
            held_gathered.discard(stage)
        elif kind == REDUCE_GRAD:
            held_gradients.discard(stage)
        elif kind == FULL_BACKWARD:
            own = {stage, rank}
            most = max(most, gathered * len(held_gathered - own) + gradient * len(held_gradients - own))
            held_gradients.add(stage)
    return most
