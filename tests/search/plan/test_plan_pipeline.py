"""What a rank's other pipeline chunks hold unsharded under FSDP2 (``plan.pipeline.unsharded_extra``)
against torch's own lowering of the same schedule (``torch_lowering``: which stages are gathered
when, and when a stage's accumulated gradient is reduced and freed)."""

from __future__ import annotations

import pytest
from torch_lowering import most_held

from nnperf.layout import Execution
from nnperf.search.plan.pipeline import rank_orders, unsharded_extra

GATHERED, GRADIENT = 1.0, 1000.0  # one chunk's bytes of each: a sum tells how many of each


@pytest.mark.parametrize(("pipeline", "virtual", "micro"), [
    (4, 2, 4), (4, 2, 6), (4, 2, 8), (4, 3, 6), (4, 3, 12), (4, 4, 8), (4, 4, 16), (8, 2, 12), (8, 4, 16),
    (8, 8, 64), (2, 5, 10),
])
def test_other_chunks_unsharded_as_torch_lowers_the_schedule(pipeline, virtual, micro):
    """Within one round of micro-batches (fewer than twice the stages) each chunk's backwards end
    before the next chunk's begin, so no other chunk holds a gradient; from two rounds on the
    chunks take turns and hold their gradients, and at most two other stages are gathered
    (torch keeps three active)."""
    execution = Execution(world=pipeline, pipeline=pipeline, pipeline_schedule="interleaved-1f1b",
                          virtual_stages=virtual, micro_batch=1, grad_accum=micro)
    order = rank_orders(execution)
    for rank in range(pipeline):
        ours = unsharded_extra(order[rank], rank, lambda s: GATHERED, lambda s: GRADIENT)
        assert ours == most_held(pipeline, virtual, micro, rank, GATHERED, GRADIENT), rank
    held = unsharded_extra(order[0], 0, lambda s: GATHERED, lambda s: GRADIENT)
    assert (held >= GRADIENT) == (micro >= 2 * pipeline)
    assert held % GRADIENT <= 2 * GATHERED
