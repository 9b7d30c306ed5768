"""The description of one zoo entry, kept apart from the registry to avoid import cycles."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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


@dataclass(frozen=True)
class Preset:
    """A published model at its published shape, built by its family's classes (so with their
    tensor-parallel plan and pipeline split): the family's options it sets, its sequence length
    and a one-line summary naming the source. One batch of one sequence by default, as the
    planner splits a global batch itself."""

    name: str
    options: dict[str, Any] = field(hash=False)
    seq: int
    summary: str

    def spec(self, options: dict[str, str], build: Callable[..., Workload]) -> ModelSpec:
        """The registry's entry: ``options`` the family's documented overrides."""
        return ModelSpec(name=self.name, summary=self.summary, family="decoder", default_batch=1,
                         default_seq=self.seq, input_desc=f"{self.seq} tokens, vocab {self.options['vocab']}",
                         options=options, build=build)
