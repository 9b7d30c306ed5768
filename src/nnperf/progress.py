"""Progress of long work, shown on a terminal and nowhere else.

The long commands (``plan``, ``fit``, ``advise``, ``measure``, ``compare``; ``calibrate`` has
bars of its own) say what they are doing and how far along they are while they work: one line
on stderr, redrawn in place and gone when the work ends. Nothing is shown on a pipe or in a
file, with ``--json``, or when nnperf is called as a library: no one installs a sink there, and
the calls below then cost a global lookup.

The work reports through three calls:

- ``expect(n)``: ``n`` more units of work are coming (searches, groups of layouts, GPUs);
- ``advance()``: one of them is done (``counted`` advances after each item of a loop);
- ``note(text)``: what is being done now (``tracing fsdp 8, micro-batch 4``).

Each report is also where a stop whose exception was lost is raised again
(``stopping.check``): long work reports often, so it stops there at the latest.

Worker processes report to their parent over a queue: a worker sends its reports there
(``to_queue``), and the parent, waiting for its workers, passes them on to its own sink
(``drain``).
"""

from __future__ import annotations

import queue as queue_module
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from nnperf import stopping

T = TypeVar("T")

#: Receives ("expect" | "advance" | "note", value); None: no one is watching.
Sink = Callable[[str, Any], None]
_sink: Sink | None = None


def expect(n: int) -> None:
    """``n`` more units of work are coming."""
    stopping.check()
    if _sink is not None and n:
        _sink("expect", n)


def advance(n: int = 1) -> None:
    """``n`` units of work are done."""
    stopping.check()
    if _sink is not None and n:
        _sink("advance", n)


def note(text: str) -> None:
    """What is being done now."""
    stopping.check()
    if _sink is not None:
        _sink("note", text)


def counted(items: Iterable[T]) -> Iterator[T]:
    """``items``, one unit advanced after the loop's body is done with each (``continue``
    included)."""
    for item in items:
        yield item
        advance()


def to_queue(channel: Any) -> None:
    """In a worker process: send this process's reports to the parent over ``channel`` (a
    multiprocessing queue), or to no one (None)."""
    global _sink
    _sink = None if channel is None else (lambda kind, value: channel.put_nowait((kind, value)))


def drain(channel: Any) -> None:
    """In the parent: pass the reports its workers sent on to this process's sink."""
    while True:
        try:
            kind, value = channel.get_nowait()
        except (queue_module.Empty, OSError, EOFError, ValueError):
            return
        if _sink is not None:
            _sink(kind, value)


def watching() -> bool:
    """Whether anyone is shown the reports (workers need a queue only then)."""
    return _sink is not None


@contextmanager
def shown(title: str, *, enabled: bool = True) -> Iterator[None]:
    """While the block runs, show ``title`` and the reports of the work on stderr, when
    ``enabled`` (not ``--json``) and stderr is a terminal; the line is cleared at the end."""
    global _sink
    if not enabled or not sys.stderr.isatty() or _sink is not None:
        yield
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )
    from rich.table import Column

    bars = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(bar_width=20),
                    MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("{task.fields[now]}", table_column=Column(no_wrap=True, overflow="ellipsis")),
                    console=Console(stderr=True), transient=True)
    task = bars.add_task(title, total=None, now="")
    expected = 0

    def sink(kind: str, value: Any) -> None:
        nonlocal expected
        if kind == "expect":
            expected += value
            bars.update(task, total=expected)
        elif kind == "advance":
            bars.advance(task, value)
        else:
            bars.update(task, now=str(value))

    _sink = sink
    with stopping.held():  # its drawing thread must not take the signals that stop the command
        bars.start()
    try:
        yield
    finally:
        _sink = None
        bars.stop()
