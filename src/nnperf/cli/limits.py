"""Click types for numeric options whose valid range is stated once, in a table.

Integers use ``nnperf.request.LIMITS`` (batch, sequence, depth, steps, ...); the one float
option of the CLI, ``--context-mib``, uses a ``schema.Range`` like the GPU fields. A value
outside its range is one line naming the option and the range (exit 2), raised as a
``UsageError`` so that it reads like every other usage error, not click's three-line usage
block; a number too large to convert (``--batch 99999999999999999999999``) is refused
before any tensor is built from it.
"""

from __future__ import annotations

from typing import Any

import click

from nnperf.errors import UsageError, shown
from nnperf.hardware.schema import Range
from nnperf.request import LIMITS

#: The measured CUDA context size of ``--context-mib``: up to 1 TiB (a context is ~0.5 GiB).
CONTEXT_MIB = Range(0, 2**20, low_closed=True)


def _label(param: click.Parameter | None) -> str:
    """'--batch' for an option, 'M' for an argument."""
    if param is None:
        return "value"
    if isinstance(param, click.Argument):
        return (param.name or "value").upper()
    return max(param.opts, key=len)


class LimitedInt(click.ParamType):
    """An integer within ``LIMITS[key]``."""

    name = "integer"

    def __init__(self, key: str) -> None:
        self.limit = LIMITS[key]

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        label = _label(param)
        if isinstance(value, int) and not isinstance(value, bool):
            return self.limit.check(value, label)
        try:
            number = int(str(value).strip())
        except ValueError:
            raise UsageError(f"invalid {label} {shown(value)}: expected {self.limit.describe()}") from None
        return self.limit.check(number, label)


class LimitedFloat(click.ParamType):
    """A finite number within a ``schema.Range``."""

    name = "number"

    def __init__(self, valid: Range) -> None:
        self.valid = valid

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        label = _label(param)
        try:
            number = float(str(value).strip()) if not isinstance(value, (int, float)) else value
        except ValueError:
            number = None
        if number is None or not self.valid.admits(number):
            raise UsageError(f"invalid {label} {shown(value)}: expected {self.valid.describe()}")
        return float(number)
