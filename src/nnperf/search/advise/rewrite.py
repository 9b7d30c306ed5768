"""Re-time the same trace with some of its ops changed: the advice items that need no new
trace (padded GEMMs, FP8 linears, fused attention, inductor's fusion).

Each rewrite maps events of the base trace to the ops that would run instead, then the
step is played again by ``passes.timing.simulate_step`` (the one timeline model): a new
``Trace`` view whose event list holds the replacements in the same order, and the counts
that go with it. Nothing here times a kernel: GEMMs go through the GEMM model, streaming
ops through the streaming model, attention through the attention model.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from nnperf.passes.count import OpCount, count_ops
from nnperf.trace.events import OpEvent, TensorMeta, Trace


@dataclass
class Rewritten:
    """A trace view and its counts after rewrites, with what the rewrites could not model."""

    trace: Trace
    counts: list[OpCount]
    notes: list[str] = field(default_factory=list)
    memory_delta: float = 0.0  # bytes added to (or, negative, taken from) the peak
    touched: set[str] = field(default_factory=set)  # modules whose ops were changed


def rebuild(trace: Trace, counts: list[OpCount], edits: dict[int, list[OpCount]],
            drop_free: Iterable[int] = ()) -> tuple[Trace, list[OpCount]]:
    """The trace with each edited event replaced by the events of its new counts (an empty
    list removes it) and the free events in ``drop_free`` removed, in the original order."""
    drop = set(drop_free)
    by_event = {id(c.event): c for c in counts}
    events: list[OpEvent] = []
    out: list[OpCount] = []
    for ev in trace.events:
        if ev.index in edits:
            for c in edits[ev.index]:
                events.append(c.event)
                out.append(c)
            continue
        if ev.index in drop:
            continue
        events.append(ev)
        c = by_event.get(id(ev))
        if c is not None:
            out.append(c)
    return replace(trace, events=events), out


def count_events(trace: Trace, events: list[OpEvent]) -> list[OpCount]:
    """Counts of synthetic events by the formula registry (the same pass as every trace)."""
    return count_ops(replace(trace, events=events))


def with_dtype(meta: TensorMeta, dtype) -> TensorMeta:  # type: ignore[no-untyped-def]
    return replace(meta, dtype=dtype)


def synthetic(like: OpEvent, func, args: tuple, inputs: list[TensorMeta],  # type: ignore[no-untyped-def]
              outputs: list[TensorMeta]) -> OpEvent:
    """An op that would run in ``like``'s place (same index, phase, module and compiled block
    call)."""
    return OpEvent(index=like.index, func=func, args=args, kwargs={}, inputs=inputs, outputs=outputs,
                   phase=like.phase, module=like.module, block_call=like.block_call)
