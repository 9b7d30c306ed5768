"""Values read from a file the user wrote or edited (a plan's JSON, a cluster's TOML): each
checked for its type and range as it is read, so that a mistake is one line naming the field,
what it holds and what would be valid (a ``UsageError``), never a traceback or a silent
conversion (``"8"`` as 8, ``NaN`` as a count, a string iterated as a list)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from nnperf.errors import UsageError, shown


def integer(value: Any, what: str, low: int, high: int) -> int:
    """A whole number from ``low`` to ``high`` (a JSON ``2.0`` counts; ``true`` does not)."""
    whole = int(value) if isinstance(value, float) and value.is_integer() else value
    if isinstance(whole, bool) or not isinstance(whole, int) or not low <= whole <= high:
        raise UsageError(f"{what} is {_held(value)}; expected a whole number from {low:,} to {high:,}")
    return whole


def number(value: Any, what: str, low: float = -math.inf, high: float = math.inf) -> float:
    """A finite number from ``low`` to ``high``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not low <= value <= high:
        bounds = f" from {low:g} to {high:g}" if math.isfinite(low) or math.isfinite(high) else ""
        raise UsageError(f"{what} is {_held(value)}; expected a finite number{bounds}")
    return float(value)


def flag(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise UsageError(f"{what} is {_held(value)}; expected true or false")
    return value


def text(value: Any, what: str, valid: tuple[str, ...] | None = None) -> str:
    """A string, one of ``valid`` where given."""
    if not isinstance(value, str) or (valid is not None and value not in valid):
        expected = f"one of {', '.join(valid)}" if valid is not None else "a string"
        raise UsageError(f"{what} is {_held(value)}; expected {expected}")
    return value


def table(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise UsageError(f"{what} is {_held(value)}; expected a table of fields")
    return value


def items(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise UsageError(f"{what} is {_held(value)}; expected a list")
    return value


def texts(value: Any, what: str) -> tuple[str, ...]:
    """A list of strings."""
    return tuple(text(v, f"{what}[{i}]") for i, v in enumerate(items(value, what)))


def _held(value: Any) -> str:
    """What a field holds, as the error shows it: the value and, when not obvious, its type."""
    if isinstance(value, (dict, list)):
        return f"a {'table' if isinstance(value, dict) else 'list'}"
    if isinstance(value, str):
        return f"the string {shown(value)}"
    if value is None:
        return "missing"
    return shown(value).strip("'")
