"""The description of one zoo entry, kept apart from the registry to avoid import cycles."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from nnperf.workload import Workload


@dataclass(frozen=True)
class ModelSpec:
    """Everything a user (or the CLI) needs to pick a built-in model and build it.

    ``build(batch, seq_len=None, **overrides)`` returns a fresh ``Workload``; ``batch`` or
    ``seq_len`` of ``None`` mean the defaults below. ``options`` lists every override key
    ``build`` accepts, so a listing can show them and typos can be reported.
    """

    name: str
    summary: str
    family: str
    default_batch: int
    default_seq: int | None
    input_desc: str
    options: dict[str, str] = field(hash=False)
    build: Callable[..., Workload] = field(hash=False, compare=False, repr=False)
