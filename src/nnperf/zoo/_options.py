"""Validation of the arguments every ``build()`` shares: batch, sequence length, overrides.

Model builders are called with user input (often strings from a command line), so every
mistake becomes a ``ModelOptionError`` (a usage error, exit 2) that names the model and what
is allowed.
"""

from __future__ import annotations

import math
from typing import Any

from nnperf.errors import ModelOptionError
from nnperf.request import INDEX_MAX
from nnperf.trace.limits import check_counts


def resolve_batch_seq(
    model: str, batch: int | None, seq_len: int | None, default_batch: int, default_seq: int | None
) -> tuple[int, int | None]:
    """Fill in defaults and reject sizes below one; non-token models refuse a sequence length."""
    batch = default_batch if batch is None else _as_int(model, "batch", batch)
    if batch < 1:
        raise ModelOptionError(f"{model}: batch must be at least 1, got {batch}")
    if default_seq is None:
        if seq_len is not None:
            raise ModelOptionError(f"{model}: takes no sequence length (got seq_len={seq_len})")
        return batch, None
    seq = default_seq if seq_len is None else _as_int(model, "seq_len", seq_len)
    if seq < 1:
        raise ModelOptionError(f"{model}: seq_len must be at least 1, got {seq}")
    return batch, seq


def resolve_options(
    model: str, overrides: dict[str, Any], defaults: dict[str, Any]
) -> dict[str, Any]:
    """Merge overrides into defaults, converting strings to the default's type.

    Unknown keys are an error rather than silently ignored: a misspelt ``n_layers`` would
    otherwise give a full-size model and a very wrong prediction.
    """
    unknown = sorted(set(overrides) - set(defaults))
    if unknown:
        valid = ", ".join(sorted(defaults)) or "none"
        raise ModelOptionError(
            f"{model}: unknown option {', '.join(repr(k) for k in unknown)}; valid options: {valid}"
        )
    config = dict(defaults)
    for key, value in overrides.items():
        default = defaults[key]
        if isinstance(default, bool):
            config[key] = _as_bool(model, key, value)
        elif isinstance(default, int):
            config[key] = _as_int(model, key, value)
        elif isinstance(default, float):
            config[key] = _as_float(model, key, value)
        else:
            config[key] = value
    check_counts({k: config[k] for k in overrides}, model)  # sizes and layer counts this machine can trace
    return config


def require_positive(model: str, config: dict[str, Any], *keys: str) -> None:
    """Reject zero or negative sizes, which would otherwise fail deep inside ``nn.Module``."""
    for key in keys:
        if config[key] < 1:
            raise ModelOptionError(f"{model}: {key} must be at least 1, got {config[key]}")


def positive_int(model: str, key: str, value: Any) -> int:
    """One override read as ``merge`` and ``require_positive`` would read it, for a caller that
    needs the value without building the model."""
    number = _as_int(model, key, value)
    require_positive(model, {key: number}, key)
    return number


def require_choice(model: str, config: dict[str, Any], key: str, kinds: tuple[str, ...]) -> None:
    """A named choice (an attention kernel, a feed-forward) is one the model builds; an unset one
    (a model without the option) is its first."""
    if config.get(key, kinds[0]) not in kinds:
        raise ModelOptionError(f"{model}: {key} must be one of {', '.join(kinds)}, got {config[key]!r}")


def require_divisible(model: str, config: dict[str, Any], num: str, den: str) -> None:
    """Attention splits ``num`` evenly into ``den`` parts; say so before torch does, obscurely."""
    if config[num] % config[den]:
        raise ModelOptionError(
            f"{model}: {num}={config[num]} must be divisible by {den}={config[den]}"
        )


def _as_int(model: str, key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str | float):
        raise ModelOptionError(f"{model}: {key} must be an integer, got {value!r}")
    try:
        number = int(value) if not isinstance(value, float) else value
    except ValueError:
        raise ModelOptionError(f"{model}: {key} must be an integer, got {value!r}") from None
    if isinstance(number, float):
        if not number.is_integer():
            raise ModelOptionError(f"{model}: {key} must be an integer, got {value!r}")
        number = int(number)
    if abs(number) > INDEX_MAX:  # 1e30 layers is a typo: refused before any block is built
        raise ModelOptionError(f"{model}: {key} must be an integer from -{INDEX_MAX:,} to {INDEX_MAX:,}, "
                               f"got {value!r}")
    return number


def _as_float(model: str, key: str, value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ModelOptionError(f"{model}: {key} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise ModelOptionError(f"{model}: {key} must be a finite number, got {value!r}")
    return number


def _as_bool(model: str, key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in {"1", "true", "yes", "on"}:
        return True
    if text in {"0", "false", "no", "off"}:
        return False
    raise ModelOptionError(f"{model}: {key} must be true or false, got {value!r}")
