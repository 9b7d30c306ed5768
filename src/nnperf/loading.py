"""Turn what the user named (a zoo model, ``file.py:factory``, ``pkg.mod:factory`` or a module
object) into a zero-argument builder of a ``Workload``.

Builders are called later, inside the tracing context, so weights and inputs created by a
factory cost no memory.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from nnperf.errors import ModelLoadError, UsageError
from nnperf.workload import Workload

INPUT_DTYPES = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
}


@dataclass(frozen=True)
class InputSpec:
    """Inputs for a bare model: explicit shapes, or token ids (batch, seq) below a vocab size."""

    shapes: tuple[tuple[int, ...], ...] = ()
    dtype: str = "fp32"
    tokens: tuple[int, int] | None = None
    vocab: int | None = None

    def build(self) -> tuple[torch.Tensor, ...]:
        if self.tokens is not None:
            b, t = self.tokens
            return (torch.randint(0, self.vocab or 32000, (b, t)),)
        dtype = INPUT_DTYPES[self.dtype]
        if dtype.is_floating_point:
            return tuple(torch.randn(s, dtype=dtype) for s in self.shapes)
        return tuple(torch.randint(0, 2, s, dtype=dtype) for s in self.shapes)

    @property
    def given(self) -> bool:
        return bool(self.shapes) or self.tokens is not None


def parse_shape(text: str) -> tuple[int, ...]:
    """``8,3,224,224`` or ``8x3x224x224`` -> (8, 3, 224, 224); every size must be >= 1."""
    parts = [p.strip() for p in text.strip().replace("x", ",").split(",")]
    try:  # an empty part is an error too: "8,x" is not the shape (8,)
        shape = tuple(int(p) for p in parts)
    except ValueError:
        raise UsageError(f"invalid shape '{text}': expected integers such as 8,3,224,224") from None
    if not shape or any(s < 1 for s in shape):
        raise UsageError(f"invalid shape '{text}': every size must be a positive integer")
    return shape


def resolve(
    target: str | nn.Module,
    *,
    batch: int | None = None,
    seq_len: int | None = None,
    inputs: Sequence[Any] | None = None,
    input_spec: InputSpec | None = None,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    overrides: dict[str, Any] | None = None,
) -> tuple[str, Callable[[], Workload]]:
    """A display name and a builder for ``target``."""
    if batch is not None and batch < 1:
        raise UsageError(f"invalid batch {batch}: must be a positive integer")
    if seq_len is not None and seq_len < 1:
        raise UsageError(f"invalid sequence length {seq_len}: must be a positive integer")
    input_spec = input_spec or InputSpec()
    if isinstance(target, nn.Module):
        name = type(target).__name__
        return name, lambda: _workload_from(target, inputs, input_spec, loss_fn, name, batch)
    if ":" in target:
        factory = _load_factory(target)
        return target, lambda: _call_factory(factory, target, inputs, input_spec, loss_fn, batch)
    from nnperf.zoo import get_model

    spec = get_model(target)
    if inputs is not None or input_spec.given:
        raise UsageError(
            f"'{spec.name}' is a built-in model with its own inputs; use --batch/--seq "
            "instead of --input-shape/--tokens"
        )

    def build() -> Workload:
        wl = spec.build(batch or spec.default_batch, seq_len, **(overrides or {}))
        if loss_fn is not None:
            wl.loss_fn = loss_fn
        return wl

    return spec.name, build


def _load_factory(target: str) -> Callable[..., Any]:
    location, _, attr = target.rpartition(":")
    if not attr:
        raise ModelLoadError(f"'{target}': expected PATH.py:FACTORY or package.module:FACTORY")
    if location.endswith(".py") or "/" in location or "\\" in location:
        path = Path(location)
        if not path.is_file():
            raise ModelLoadError(f"model file '{location}' does not exist")
        mod_name = f"nnperf_user_{abs(hash(str(path.resolve())))}"
        spec = importlib.util.spec_from_file_location(mod_name, path)
        if spec is None or spec.loader is None:
            raise ModelLoadError(f"model file '{location}' cannot be imported as Python")
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        sys.path.insert(0, str(path.resolve().parent))
        try:
            spec.loader.exec_module(module)
        except Exception as err:
            raise ModelLoadError(f"importing '{location}' failed: {type(err).__name__}: {err}") from None
        finally:
            sys.path.remove(str(path.resolve().parent))
    else:
        try:
            module = importlib.import_module(location)
        except Exception as err:
            raise ModelLoadError(f"importing module '{location}' failed: {type(err).__name__}: {err}") from None
    factory = getattr(module, attr, None)
    if factory is None or not callable(factory):
        raise ModelLoadError(f"'{location}' has no callable named '{attr}'")
    return factory


def _call_factory(factory, target, inputs, input_spec, loss_fn, batch) -> Workload:
    kwargs = {}
    if batch is not None and "batch" in inspect.signature(factory).parameters:
        kwargs["batch"] = batch
    try:
        produced = factory(**kwargs)
    except Exception as err:
        raise ModelLoadError(f"factory '{target}' raised {type(err).__name__}: {err}") from None
    if isinstance(produced, Workload):
        if loss_fn is not None:
            produced.loss_fn = loss_fn
        return produced
    model, given_inputs, given_loss = produced, None, None
    if isinstance(produced, tuple):
        if len(produced) not in (2, 3) or not isinstance(produced[0], nn.Module):
            raise ModelLoadError(
                f"factory '{target}' must return a model, (model, inputs) or "
                "(model, inputs, loss_fn)"
            )
        model, given_inputs = produced[0], produced[1]
        given_loss = produced[2] if len(produced) == 3 else None
    if not isinstance(model, nn.Module):
        raise ModelLoadError(f"factory '{target}' returned {type(model).__name__}, not a torch.nn.Module")
    if given_inputs is not None and inputs is None and not input_spec.given:
        inputs = given_inputs
    return _workload_from(model, inputs, input_spec, loss_fn or given_loss, target, batch)


def _workload_from(model, inputs, input_spec, loss_fn, name, batch) -> Workload:
    if inputs is None:
        if not input_spec.given:
            raise UsageError(
                f"'{name}' is a bare model: give its inputs with --input-shape (e.g. 8,3,224,224) "
                "or --tokens B,T --vocab V, or return (model, inputs) from the factory"
            )
        inputs = input_spec.build()
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    elif isinstance(inputs, dict):
        raise UsageError("keyword inputs are not supported; pass a tuple of positional inputs")
    inputs = tuple(inputs)
    first = next((t for t in inputs if isinstance(t, torch.Tensor) and t.dim() > 0), None)
    samples = int(first.shape[0]) if first is not None else (batch or 1)
    tokens = samples * int(first.shape[1]) if input_spec.tokens is not None and first is not None else None
    return Workload(model=model, inputs=inputs, loss_fn=loss_fn, samples=samples, tokens=tokens, name=name)
