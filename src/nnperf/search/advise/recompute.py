"""Activation checkpointing per block, full or selective, traded against batch size.

Both are traced (``search.memory_variants``): full recomputes each block's forward in
backward; selective keeps the matrix products' outputs and recomputes the rest (the
attention core, pointwise ops, norms). Each costs time at the same batch and frees memory;
the driver also finds the largest batch each lets fit (``search.fit``) and predicts the
step there, so the item says what the memory buys.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nnperf.search.advise.change import Candidate, Change
from nnperf.trace.blocks import repeated_blocks

if TYPE_CHECKING:
    from nnperf.search.advise.evaluate import Base

HOW = {
    "full": "x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)  # for each block",
    "selective": ("ctx = functools.partial(create_selective_checkpoint_contexts, policy)  # save mm/addmm/"
                  "attention outputs, recompute the rest\n"
                  "x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False, context_fn=ctx)"),
}


def blocks(base: Base) -> list[str]:
    return repeated_blocks(base.analysis.workload.model)


def candidates(base: Base) -> list[Candidate]:
    if not base.options.trace.train or base.options.checkpoint:
        return []
    found = blocks(base)
    if not found:
        return []
    shown = found[:3] + ([f"... ({len(found)} blocks)"] if len(found) > 3 else [])
    return [Candidate(
        name=f"checkpoint-{kind}", family="recompute",
        title=f"{kind} activation checkpointing of each of the {len(found)} blocks",
        change=Change(recompute=kind), how=HOW[kind], layers=shown,
        assumptions=["costs time at the same batch: its value is the memory it frees, i.e. the "
                     "larger batch it lets fit (see 'largest batch')",
                     "recomputed ops are timed like the forward ones"],
    ) for kind in ("full", "selective")]
