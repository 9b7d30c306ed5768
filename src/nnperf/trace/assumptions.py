"""Assumptions the tracer had to make where the real step would read tensor values.

On fake tensors some shapes depend on values no trace has (how many tokens a router sends
to each expert, the lengths of packed sequences computed on the device). Rather than
fail, the tracer takes a stated assumption, and every assumption made ends up in the
trace's config (``Trace.config["assumptions"]``), so reports can say what the figures
rest on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

_STACK: list[list[str]] = []


@contextlib.contextmanager
def collecting() -> Iterator[list[str]]:
    """Collect the assumptions made while tracing (each stated once, in order)."""
    notes: list[str] = []
    _STACK.append(notes)
    try:
        yield notes
    finally:
        _STACK.pop()


def assume(text: str) -> None:
    """State an assumption of the trace under way (nothing outside a trace)."""
    if _STACK and text not in _STACK[-1]:
        _STACK[-1].append(text)
