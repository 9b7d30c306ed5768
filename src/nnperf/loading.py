"""Turn a ``ModelRequest`` (a zoo model, ``file.py:factory``, ``pkg.mod:factory`` or a module
object, with its batch and inputs) into a zero-argument builder of a ``Workload``.

Builders are called later, inside the tracing context, so weights and inputs created by a
factory cost no memory.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from nnperf.errors import ModelLoadError, UsageError
from nnperf.request import ModelRequest
from nnperf.workload import LossFn, Workload


def resolve(request: ModelRequest) -> tuple[str, Callable[[], Workload]]:
    """A display name and a builder for the requested workload."""
    target = request.target
    if isinstance(target, nn.Module):
        name = type(target).__name__
        return name, lambda: _workload_from(target, name, request, request.inputs, request.loss_fn)
    if ":" in target:
        factory = _load_factory(target)
        return target, lambda: _call_factory(factory, request)
    from nnperf.zoo import get_model

    spec = get_model(target)
    if request.inputs is not None or request.input_spec.given:
        raise UsageError(
            f"'{spec.name}' is a built-in model with its own inputs; use --batch/--seq "
            "instead of --input-shape/--tokens"
        )

    def build() -> Workload:
        wl = spec.build(request.batch or spec.default_batch, request.seq_len, **request.overrides)
        if request.loss_fn is not None:
            wl.loss_fn = request.loss_fn
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


def _call_factory(factory: Callable[..., Any], request: ModelRequest) -> Workload:
    target = str(request.target)
    kwargs = {}
    if request.batch is not None and "batch" in inspect.signature(factory).parameters:
        kwargs["batch"] = request.batch
    try:
        produced = factory(**kwargs)
    except Exception as err:
        raise ModelLoadError(f"factory '{target}' raised {type(err).__name__}: {err}") from None
    if isinstance(produced, Workload):
        if request.loss_fn is not None:
            produced.loss_fn = request.loss_fn
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
    inputs = request.inputs
    if given_inputs is not None and inputs is None and not request.input_spec.given:
        inputs = given_inputs
    return _workload_from(model, target, request, inputs, request.loss_fn or given_loss)


def _workload_from(
    model: nn.Module,
    name: str,
    request: ModelRequest,
    inputs: Sequence[Any] | torch.Tensor | None,
    loss_fn: LossFn | None,
) -> Workload:
    """A bare model's workload: the given inputs (or those of the request's input spec)."""
    spec = request.input_spec
    if inputs is None:
        if not spec.given:
            raise UsageError(
                f"'{name}' is a bare model: give its inputs with --input-shape (e.g. 8,3,224,224) "
                "or --tokens B,T --vocab V, or return (model, inputs) from the factory"
            )
        inputs = spec.build()
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    elif isinstance(inputs, dict):
        raise UsageError("keyword inputs are not supported; pass a tuple of positional inputs")
    inputs = tuple(inputs)
    first = next((t for t in inputs if isinstance(t, torch.Tensor) and t.dim() > 0), None)
    samples = int(first.shape[0]) if first is not None else (request.batch or 1)
    tokens = samples * int(first.shape[1]) if spec.tokens is not None and first is not None else None
    return Workload(model=model, inputs=inputs, loss_fn=loss_fn, samples=samples, tokens=tokens, name=name)
