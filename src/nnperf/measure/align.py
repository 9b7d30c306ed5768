"""Attribute measured time to the trace's ops by aligning the profiler's op sequence with it.

The PyTorch profiler records a tree of ops per thread (``aten::linear`` calling ``aten::t``
and ``aten::addmm``, autograd nodes wrapping backward ops, the optimizer's record_function
wrapping foreach ops). The trace records ops below autograd, at the dispatch level. So the
profiler tree is flattened to the *outermost op whose name the trace also has*; subtrees with
no such name contribute their leaf aten ops as "profiler only" entries. That sequence, in
start-time order, is aligned with the trace's non-free events by name and order
(``difflib.SequenceMatcher``: longest matching blocks, so a few extra or missing ops on either
side shift nothing else). Matched trace events receive the profiled op's time; unmatched time
is reported, never silently spread, and the attributed share says how much was matched.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ProfiledOp:
    """One op the profiler saw: its name in trace spelling (``aten.addmm``) and its time."""

    name: str
    time_s: float
    start_us: float = 0.0


@dataclass
class Alignment:
    """Trace event index -> measured seconds, plus what could not be matched."""

    by_event: dict[int, float] = field(default_factory=dict)
    matched_s: float = 0.0
    unmatched_s: float = 0.0
    profiler_only: dict[str, float] = field(default_factory=dict)  # op name -> seconds
    trace_only: dict[str, int] = field(default_factory=dict)  # op name -> count
    matched_ops: int = 0
    profiled_ops: int = 0
    trace_ops: int = 0

    @property
    def total_s(self) -> float:
        return self.matched_s + self.unmatched_s

    @property
    def attributed_share(self) -> float:
        """Share of the profiled ops' time that landed on a trace op."""
        return self.matched_s / self.total_s if self.total_s else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "matched_s": self.matched_s,
            "unmatched_s": self.unmatched_s,
            "attributed_share_of_op_time": self.attributed_share,
            "matched_ops": self.matched_ops,
            "profiled_ops": self.profiled_ops,
            "trace_ops": self.trace_ops,
            "profiler_only": dict(sorted(self.profiler_only.items(), key=lambda kv: -kv[1])[:20]),
            "trace_only": dict(sorted(self.trace_only.items(), key=lambda kv: -kv[1])[:20]),
        }


def profiler_name(name: str) -> str:
    """``aten::addmm`` -> ``aten.addmm`` (the trace's spelling)."""
    return name.replace("::", ".")


def flatten_profile(roots: Iterable[Any], known: set[str], *, device_time: bool) -> list[ProfiledOp]:
    """Outermost known ops of profiler event trees, in start order.

    ``roots`` are ``FunctionEvent``-like objects (``name``, ``cpu_children``,
    ``cpu_time_total``/``device_time_total`` in microseconds, ``time_range.start``).
    """
    out: list[ProfiledOp] = []

    def op_time(ev: Any) -> float:
        us = getattr(ev, "device_time_total", 0.0) if device_time else ev.cpu_time_total
        return float(us) * 1e-6

    def start(ev: Any) -> float:
        return float(ev.time_range.start)

    def walk(ev: Any) -> None:
        name = profiler_name(ev.name)
        if name in known:
            out.append(ProfiledOp(name, op_time(ev), start(ev)))
            return
        children = sorted(ev.cpu_children, key=start)
        if children:
            for child in children:
                walk(child)
        elif name.startswith("aten."):
            out.append(ProfiledOp(name, op_time(ev), start(ev)))

    for root in sorted(roots, key=start):
        walk(root)
    out.sort(key=lambda p: p.start_us)
    return out


def align(trace_ops: Sequence[tuple[int, str]], profiled: Sequence[ProfiledOp]) -> Alignment:
    """Match ``(event index, name)`` trace ops with profiled ops by name and order."""
    a = [name for _, name in trace_ops]
    b = [p.name for p in profiled]
    result = Alignment(profiled_ops=len(profiled), trace_ops=len(trace_ops))
    matcher = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    matched_b: set[int] = set()
    matched_a: set[int] = set()
    for block in matcher.get_matching_blocks():
        for i in range(block.size):
            ia, ib = block.a + i, block.b + i
            index = trace_ops[ia][0]
            result.by_event[index] = result.by_event.get(index, 0.0) + profiled[ib].time_s
            result.matched_s += profiled[ib].time_s
            matched_a.add(ia)
            matched_b.add(ib)
    result.matched_ops = len(matched_b)
    for ib, p in enumerate(profiled):
        if ib not in matched_b:
            result.unmatched_s += p.time_s
            result.profiler_only[p.name] = result.profiler_only.get(p.name, 0.0) + p.time_s
    for ia, (_, name) in enumerate(trace_ops):
        if ia not in matched_a:
            result.trace_only[name] = result.trace_only.get(name, 0) + 1
    return result
