"""Turn a ``ModelRequest`` (a zoo model, a library model ``hf:``/``timm:``/``tv:``,
``file.py:factory``, ``pkg.mod:factory`` or a module object, with its batch and inputs) into a
zero-argument builder of a ``Workload``.

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

from nnperf import hub
from nnperf.errors import ModelLoadError, UsageError, shown
from nnperf.request import ModelRequest
from nnperf.trace.construction import build_as_user_code, reads_tensor_values, unwrap_compiled
from nnperf.trace.limits import bounded_build
from nnperf.workload import LossFn, Workload


def resolve(request: ModelRequest) -> tuple[str, Callable[[], Workload]]:
    """A display name and a builder for the requested workload; the builder stops a build
    that registers more modules than a trace may hold on this machine (``trace.limits``)."""
    name, build = _resolve(request)

    def bounded() -> Workload:
        with bounded_build(name):
            return build()

    return name, bounded


def _resolve(request: ModelRequest) -> tuple[str, Callable[[], Workload]]:
    target = request.target
    if isinstance(target, nn.Module):
        name = type(target).__name__
        _refuse_hub_settings(request)
        _refuse_zoo_settings(request, f"'{name}' is a model object")
        return name, lambda: _workload_from(target, name, request, request.inputs, request.loss_fn)
    _refuse_hub_settings(request)
    library = hub.split(target)
    if library is not None:
        return _hub_builder(request, *library)
    if ":" in target:
        _refuse_zoo_settings(request, f"'{target}' is a factory", seq=False)
        factory = _load_factory(target)
        params = _parameters(factory)
        if request.seq_len is not None and not params & set(SEQ_PARAMETERS):
            raise UsageError(
                f"--seq {request.seq_len} is not used: factory '{target}' takes no "
                f"{' or '.join(SEQ_PARAMETERS)} parameter; give the sequence length in its "
                "inputs (--tokens B,T or --input-shape) or add a seq_len parameter to the factory"
            )
        return target, lambda: _call_factory(factory, request, params)
    from nnperf.zoo import get_model

    if len(target) > MAX_NAME:  # no model is called that: a pasted blob, not a typo to match
        raise ModelLoadError(f"unknown model {shown(target)}: give a built-in name (nnperf models), "
                             "hf:ID, timm:NAME, tv:NAME, PATH.py:FACTORY or package.module:FACTORY")
    if target.endswith(".py"):  # a file without the function that builds the model
        raise ModelLoadError(f"{shown(target)} names a Python file: add the function that returns the model, "
                             f"'{target}:FACTORY' (it returns a model, (model, inputs) or (model, inputs, loss_fn))")
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


def _refuse_hub_settings(request: ModelRequest) -> None:
    """``--task`` and ``--attn-implementation`` configure a Hugging Face model only."""
    target = request.target
    if isinstance(target, str) and target.startswith("hf:"):
        return
    what = f"'{target}' is not an hf: model" if isinstance(target, str) else "a model object is given"
    for value, option in ((request.task, "--task"), (request.attn_implementation, "--attn-implementation")):
        if value is not None:
            raise UsageError(f"{option} {value} is not used: it configures Hugging Face models "
                             f"(hf:ID) and {what}; set it where the model is built")


def _hub_builder(request: ModelRequest, prefix: str, name: str) -> tuple[str, Callable[[], Workload]]:
    """A library model: it makes its own inputs, sized by --batch (and --seq for text)."""
    if request.inputs is not None or request.input_spec.given:
        raise UsageError(f"'{request.target}' makes its own inputs; use --batch/--seq instead of "
                         "--input-shape/--tokens")
    if not name:
        raise ModelLoadError(f"{shown(request.target)}: give a model name after '{prefix}:', e.g. "
                             + {"hf": "hf:gpt2", "timm": "timm:convnext_tiny", "tv": "tv:resnet50"}[prefix])
    display, build = hub.builder(prefix, hub.HubRequest(
        name=name, batch=request.batch, seq_len=request.seq_len, overrides=dict(request.overrides),
        task=request.task, attn_implementation=request.attn_implementation))

    def build_with_loss() -> Workload:
        wl = build()
        if request.loss_fn is not None:
            wl.loss_fn = request.loss_fn
        return wl

    return display, build_with_loss


def _load_factory(target: str) -> Callable[..., Any]:
    location, _, attr = target.rpartition(":")
    if not attr or not location:
        raise ModelLoadError(f"{shown(target)}: expected PATH.py:FACTORY or package.module:FACTORY")
    if location.endswith(".py") or "/" in location or "\\" in location:
        path = Path(location)
        try:
            found = path.is_file()
        except OSError as err:  # a name too long for the file system, a folder not searchable
            raise ModelLoadError(f"model file {shown(location)} cannot be read: {err.strerror or err}") from None
        if not found:
            raise ModelLoadError(f"model file {shown(location)} does not exist")
        mod_name = f"nnperf_user_{abs(hash(str(path.resolve())))}"
        spec = importlib.util.spec_from_file_location(mod_name, path)
        if spec is None or spec.loader is None:
            raise ModelLoadError(f"model file '{location}' cannot be imported as Python")
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        sys.path.insert(0, str(path.resolve().parent))
        try:
            spec.loader.exec_module(module)
        except (Exception, SystemExit) as err:  # sys.exit() at import is a failure, not our exit
            raise ModelLoadError(f"importing {shown(location)} failed: {_raised(err)}") from None
        finally:
            sys.path.remove(str(path.resolve().parent))
    else:
        try:
            module = importlib.import_module(location)
        except (Exception, SystemExit) as err:
            raise ModelLoadError(f"importing module {shown(location)} failed: {_raised(err)}") from None
    factory = getattr(module, attr, None)
    if factory is None or not callable(factory):
        raise ModelLoadError(f"{shown(location)} has no callable named {shown(attr)}")
    return factory


def _raised(err: BaseException) -> str:
    """'ValueError: bad width', 'SystemExit(7)': what user code raised, in one line."""
    if isinstance(err, SystemExit):
        return f"SystemExit({err.code!r})"
    text = " ".join(str(err).split())
    if len(text) > 300:  # e.g. "No module named '<5000 characters>'"
        text = f"{text[:150]}[...]{text[-150:]}"
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _refuse_zoo_settings(request: ModelRequest, what: str, seq: bool = True) -> None:
    """Settings that only size a built-in model would be silently dropped for ``what``
    (a factory or a model object): say so instead. ``seq``: check the sequence length too
    (a factory may take one, which the caller checks against its signature)."""
    if request.overrides:
        given = " ".join(f"-O {k}={v}" for k, v in request.overrides.items())
        raise UsageError(
            f"{given} is not used: model options (-O KEY=VALUE) configure built-in models only, "
            f"and {what}; set them where the model is built"
        )
    if seq and request.seq_len is not None:
        raise UsageError(
            f"--seq {request.seq_len} is not used: {what}; give the sequence length in its "
            "inputs (inputs=, --tokens B,T or --input-shape)"
        )


#: The longest built-in model name looked up (the zoo's are under 30 characters).
MAX_NAME = 200

#: Parameter names through which a factory receives --seq (the first one it has).
SEQ_PARAMETERS = ("seq_len", "seq")


def _parameters(factory: Callable[..., Any]) -> set[str]:
    """The named parameters of a factory (none known for callables without a signature)."""
    try:
        return set(inspect.signature(factory).parameters)
    except (TypeError, ValueError):
        return set()


def _call_factory(factory: Callable[..., Any], request: ModelRequest, params: set[str]) -> Workload:
    target = str(request.target)
    kwargs: dict[str, Any] = {}
    if request.batch is not None and "batch" in params:
        kwargs["batch"] = request.batch
    if request.seq_len is not None:
        kwargs[next(p for p in SEQ_PARAMETERS if p in params)] = request.seq_len
    try:  # as user code runs: .to(dtype), .to("cuda"), torch.compile work (trace.construction)
        produced = build_as_user_code(lambda: factory(**kwargs))
    except (Exception, SystemExit) as err:  # its SystemExit(7) must not become nnperf's exit 7
        hint = ""
        if reads_tensor_values(err):
            hint = ("; building the model reads a tensor's value, which fake tensors do not "
                    "have, even with its parameters on the meta device: trace with --real "
                    "(real CPU tensors), or compute that value with Python numbers")
        raise ModelLoadError(f"factory {shown(target)} raised {_raised(err)}{hint}") from None
    if isinstance(produced, Workload):
        if request.loss_fn is not None:
            produced.loss_fn = request.loss_fn
        produced.model = _eager(produced.model, produced.info)
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
    info: dict[str, Any] = {}
    model = _eager(model, info)
    inputs = request.inputs
    from_factory = given_inputs is not None and inputs is None and not request.input_spec.given
    if from_factory:
        inputs = given_inputs
    # the factory's own inputs were sized by --batch when it takes a batch parameter
    wl = _workload_from(model, target, request, inputs, request.loss_fn or given_loss,
                        from_factory=from_factory, sized_by_batch=from_factory and "batch" in kwargs)
    wl.info.update(info)
    return wl


def _eager(model: nn.Module, info: dict[str, Any]) -> nn.Module:
    """The eager module behind a ``torch.compile``'d one; ``info`` says the trace is eager's."""
    model, compiled = unwrap_compiled(model)
    if compiled:
        info["torch_compile"] = "traced eager: the ops before torch.compile fuses them"
    return model


def _workload_from(
    model: nn.Module,
    name: str,
    request: ModelRequest,
    inputs: Sequence[Any] | torch.Tensor | None,
    loss_fn: LossFn | None,
    *,
    from_factory: bool = False,
    sized_by_batch: bool = False,
) -> Workload:
    """A bare model's workload: the given inputs (or those of the request's input spec).

    The batch is the first dimension of the first input, so a ``batch`` in the request that
    is not that number would be ignored: an error instead, unless the factory that made the
    inputs took ``batch`` (``sized_by_batch``: it is the factory's business then).
    """
    spec = request.input_spec
    from_spec = inputs is None
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
    if request.batch is not None and samples != request.batch and not sized_by_batch:
        raise UsageError(_batch_conflict(request, name, samples, from_spec, from_factory))
    tokens = samples * int(first.shape[1]) if spec.tokens is not None and first is not None else None
    return Workload(model=model, inputs=inputs, loss_fn=loss_fn, samples=samples, tokens=tokens, name=name)


def _batch_conflict(
    request: ModelRequest, name: str, samples: int, from_spec: bool, from_factory: bool
) -> str:
    """The message for a batch that the inputs contradict, naming both."""
    spec = request.input_spec
    batch = request.batch
    if from_spec and spec.tokens is not None:
        b, t = spec.tokens
        return (f"--batch {batch} contradicts --tokens {b},{t}: B={b} is the batch; "
                "drop --batch or change --tokens")
    if from_spec:
        shape = ",".join(str(s) for s in spec.shapes[0])
        return (f"--batch {batch} contradicts --input-shape {shape}: its first dimension, "
                f"{samples}, is the batch; drop --batch or change the shape")
    if from_factory:
        return (f"--batch {batch} contradicts the inputs factory '{name}' returns (batch "
                f"{samples}), and the factory takes no batch parameter to resize them; drop "
                "--batch or give the factory a batch parameter")
    return (f"batch={batch} contradicts the inputs given (their first dimension, the batch, "
            f"is {samples}); drop batch or change the inputs")
