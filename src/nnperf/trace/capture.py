"""Capture one inference forward or one whole training step of a workload as a Trace.

Everything runs under ``FakeTensorMode``: weights, activations and gradients have shapes
and dtypes but no memory, so a 7B-parameter model traces on a laptop. ``real=True`` runs
the same recording on real CPU tensors, the way forward for models whose control flow
depends on data (``nonzero``, ``.item()``, expert routing).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import sysconfig
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
    UnsupportedOperatorException,
)
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

from nnperf.errors import NnperfError, TraceError, UsageError
from nnperf.trace.accumulation import AccumulationWatch, fold_inplace_accumulations
from nnperf.trace.events import (
    KIND_BUFFER,
    KIND_GRAD,
    KIND_INPUT,
    KIND_OPT_STATE,
    KIND_PARAM,
    Trace,
    dtype_name,
)
from nnperf.trace.grad_scaler import GRAD_SCALER_MODULE, TracedGradScaler
from nnperf.trace.recorder import GraphLabeler, ModuleStack, OpRecorder
from nnperf.workload import Workload, default_loss

OPTIMIZERS = ("adamw", "adam", "sgd", "sgd-momentum", "none")
OPTIMIZER_IMPLS = ("foreach", "single", "fused")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64}
AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
_DATA_DEPENDENT = (
    DataDependentOutputException,
    DynamicOutputShapeException,
    GuardOnDataDependentSymNode,
    UnsupportedOperatorException,
)
#: Logs every failing meta kernel with a full traceback at ERROR level (~20 lines per
#: failure, often repeated): noise on top of the one-line error nnperf reports instead.
_FAKE_TENSOR_LOGGER = "torch._subclasses.fake_tensor"
#: nnperf code that runs inside the model's step (dispatch and function modes, autograd
#: hooks, the GradScaler stand-in, the memory pass's recomputation): an exception raised by
#: these files themselves is a bug of nnperf, reported with its traceback, not a problem
#: of the user's model. ``capture.py`` (it only calls the model) and ``attention.py`` (the
#: model's own attention, re-implemented) are left out on purpose.
def _spellings(*paths: Path) -> tuple[str, ...]:
    """Each path as written and resolved: frames name files the way they were imported."""
    return tuple(dict.fromkeys(s for p in paths for s in (str(p), str(p.resolve()))))


_HERE = Path(__file__).parent
_NNPERF_INTERNALS = _spellings(
    _HERE / "recorder.py", _HERE / "accumulation.py", _HERE / "grad_scaler.py",
    _HERE / "events.py", _HERE.parent / "passes",
)
#: Code a model's failure passes through on its way up and that says nothing about who
#: caused it: PyTorch itself and the standard library.
_PASS_THROUGH = (
    *_spellings(Path(torch.__file__).parent, Path(sysconfig.get_paths()["stdlib"])),
    "<frozen ",
)


@dataclass(frozen=True)
class TraceOptions:
    """How the step is run. Defaults mirror a plain PyTorch training loop on a GPU."""

    train: bool = True
    optimizer: str = "adamw"
    optimizer_impl: str = "foreach"  # PyTorch's default for CUDA tensors
    dtype: str | None = None  # cast the model and floating inputs (pure low precision)
    amp: str | None = None  # autocast dtype (mixed precision)
    real: bool = False  # run on real CPU tensors instead of fake ones
    # Gradients already allocated when the step starts: gradient accumulation from the second
    # micro-batch on, or zero_grad(set_to_none=False). Memory differs (forward runs with grads).
    grads_persist: bool = False
    # torch.amp.GradScaler (scale, unscale_, the found-inf host sync, update). None: the
    # default of a real loop, on for --amp fp16 training (fp16 gradients underflow without
    # it); bf16 has fp32's range and nobody scales it. False: fp16 training without a scaler.
    grad_scaler: bool | None = None

    def uses_grad_scaler(self) -> bool:
        """Whether the traced step runs a GradScaler (``grad_scaler`` resolved)."""
        if self.grad_scaler is not None:
            return self.grad_scaler
        # Pure fp16 weights have fp16 gradients, which GradScaler refuses to unscale.
        return (
            self.train and self.amp == "fp16" and self.dtype != "fp16" and self.optimizer != "none"
        )

    def validate(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise UsageError(f"unknown optimizer '{self.optimizer}'; valid: {', '.join(OPTIMIZERS)}")
        if self.optimizer_impl not in OPTIMIZER_IMPLS:
            raise UsageError(
                f"unknown optimizer implementation '{self.optimizer_impl}'; "
                f"valid: {', '.join(OPTIMIZER_IMPLS)}"
            )
        if self.dtype is not None and self.dtype not in DTYPES:
            raise UsageError(f"unknown dtype '{self.dtype}'; valid: {', '.join(DTYPES)}")
        if self.amp is not None and self.amp not in AMP_DTYPES:
            raise UsageError(f"unknown autocast dtype '{self.amp}'; valid: {', '.join(AMP_DTYPES)}")
        if self.grad_scaler:
            if not self.train or self.optimizer == "none":
                raise UsageError("a gradient scaler needs a training step with an optimizer")
            if self.dtype == "fp16":
                raise UsageError(
                    "a gradient scaler cannot unscale fp16 gradients (--dtype fp16); "
                    "use --amp fp16 with fp32 weights"
                )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def trace_workload(build: Callable[[], Workload], options: TraceOptions) -> tuple[Trace, Workload]:
    """Build the workload inside the tracing context and record one step of it."""
    options.validate()
    # Non-fake tensors a user model keeps as plain attributes (not buffers) become fakes on use.
    fake_mode = None if options.real else FakeTensorMode(allow_non_fake_inputs=True)
    with _quiet_fake_tensor_log(), fake_mode if fake_mode is not None else contextlib.nullcontext():
        workload = build()
        restore = _swap_in_private_copies(workload, fake_mode)
        try:
            workload = _cast(workload, options.dtype)
            model = workload.model
            model.train(options.train)
            optimizer = _make_optimizer(model, options) if options.train else None
            scaler = (
                TracedGradScaler() if optimizer is not None and options.uses_grad_scaler() else None
            )
            if optimizer is not None:
                _initialize_state(model, optimizer, scaler)
            if options.train and options.grads_persist:
                _allocate_grads(model)
            return _record(workload, optimizer, scaler, options), workload
        finally:
            restore()


def _swap_in_private_copies(
    workload: Workload, fake_mode: FakeTensorMode | None
) -> Callable[[], None]:
    """Replace the parameters, buffers and inputs of a model the user already built by fakes
    (or, with ``real``, by copies) and remember each module's train/eval flag.

    The user's module is modified in place for the duration of the trace and restored after,
    so tracing a real model neither copies its weights (fake mode) nor changes their values,
    gradients, running statistics or train/eval mode (the traced step runs an optimizer).
    """
    from torch._subclasses.fake_tensor import FakeTensor

    def private(t: torch.Tensor) -> torch.Tensor:
        if fake_mode is None:
            return t.detach().clone()
        return fake_mode.from_tensor(t)

    originals: list[tuple[dict, str, Any]] = []
    copies: dict[int, torch.Tensor] = {}
    flags = [(m, m.training) for m in workload.model.modules()]
    for module in workload.model.modules():
        for table in (module._parameters, module._buffers):
            for name, value in table.items():
                if value is None or isinstance(value, FakeTensor):
                    continue
                copy = copies.get(id(value))
                if copy is None:  # a tied weight stays tied: one copy for all its owners
                    copy = private(value)
                    if isinstance(value, torch.nn.Parameter):
                        copy = torch.nn.Parameter(copy, requires_grad=value.requires_grad)
                    copies[id(value)] = copy
                originals.append((table, name, value))
                table[name] = copy
    real_inputs = workload.inputs
    if fake_mode is not None:
        workload.inputs = tuple(
            fake_mode.from_tensor(t)
            if isinstance(t, torch.Tensor) and not isinstance(t, FakeTensor)
            else t
            for t in workload.inputs
        )

    def restore() -> None:
        for table, name, value in originals:
            table[name] = value
        for module, training in flags:
            module.training = training
        workload.inputs = real_inputs

    return restore


def _record(
    workload: Workload, optimizer: Any, scaler: TracedGradScaler | None, options: TraceOptions
) -> Trace:
    model = workload.model
    names: dict[int, str] = {}
    for name, mod in model.named_modules(remove_duplicate=False):
        names.setdefault(id(mod), name)
    kinds = _known_storage_kinds(workload)
    if scaler is not None:
        # Persistent 0-dim device tensors, like a model's buffers (the memory pass keeps them
        # on the device for the whole step).
        for name, t in scaler.state_tensors().items():
            kinds[id(t.untyped_storage())] = (KIND_BUFFER, f"{GRAD_SCALER_MODULE}.{name}")
    modules = ModuleStack(names)
    accumulation = AccumulationWatch()
    recorder = OpRecorder(modules, kinds, accumulation)
    if scaler is not None:
        recorder.answer = scaler.finite.answer
    amp = (
        torch.autocast("cpu", dtype=AMP_DTYPES[options.amp])
        if options.amp
        else contextlib.nullcontext()
    )
    grad = contextlib.nullcontext() if options.train else torch.no_grad()
    # What the step is doing, for the message when the user's model fails: its forward, its
    # loss or its backward run the user's code; nnperf's own steps (the GradScaler and the
    # optimizer nnperf chose) leave ``user_part`` None.
    user_part: str | None = "forward"
    try:
        with modules, GraphLabeler(modules), recorder, grad:
            with amp:
                output = model(*workload.inputs)
                if options.train:
                    user_part = "loss"
                    modules.push("(loss)")
                    loss = (workload.loss_fn or default_loss)(output)
                    modules.pop()
            user_part = None
            if options.train:
                if scaler is not None:
                    modules.push(GRAD_SCALER_MODULE)
                    loss = scaler.scale(loss)
                    modules.pop()
                recorder.phase = "backward"
                accumulation.watch_graph([loss])
                user_part = "backward"
                loss.backward()
                user_part = None
                accumulation.reset()
                del loss, output  # a training loop drops them before the optimizer step
                if optimizer is not None and scaler is not None:
                    _scaled_optimizer_step(scaler, optimizer, recorder, modules)
                elif optimizer is not None:
                    recorder.phase = "optimizer"
                    optimizer.step()
    except _DATA_DEPENDENT as err:
        raise _data_dependent_error(err, recorder, modules) from None
    except NnperfError:
        raise
    except Exception as err:
        if user_part is None or _raised_by_nnperf(err, recorder):
            raise  # a bug of nnperf: keep the traceback
        raise _model_failed_error(err, user_part, workload, recorder, modules, names, options) from None
    _classify_late_storages(recorder, model, optimizer)
    recorder.active = False
    module_types = {names[id(m)]: type(m).__name__ for m in model.modules()}
    module_params = {
        names[id(m)]: sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()
    }
    param_storages = {
        recorder.storage_id(p, None): n for n, p in model.named_parameters()
    }
    trace = Trace(
        events=recorder.events,
        storages=recorder.storages,
        module_types=module_types,
        module_params=module_params,
        param_storages=param_storages,
        # every name of a tied parameter, so each owning module knows its weight shapes
        param_shapes={
            n: tuple(p.shape) for n, p in model.named_parameters(remove_duplicate=False)
        },
        module_output_bytes=dict(modules.output_bytes),
        mode="train" if options.train else "inference",
        config={
            "options": options.to_json(),
            "inputs": _input_descriptions(workload.inputs),
            "grad_scaler": scaler is not None,
        },
    )
    fold_inplace_accumulations(trace, recorder.engine_sums)
    return trace


def _scaled_optimizer_step(
    scaler: TracedGradScaler, optimizer: Any, recorder: OpRecorder, modules: ModuleStack
) -> None:
    """``scaler.step(optimizer); scaler.update()``: the scaler's work before the optimizer
    step stays in the backward phase, the optimizer's own ops are ``(optimizer)`` ones and
    ``update`` is an optimizer-phase op of the scaler (see ``trace.grad_scaler``)."""

    def optimizer_starts() -> None:
        modules.pop()
        recorder.phase = "optimizer"

    modules.push(GRAD_SCALER_MODULE)
    scaler.step(optimizer, optimizer_starts, lambda: modules.push(GRAD_SCALER_MODULE))
    modules.pop()


def _input_descriptions(inputs: tuple[Any, ...]) -> list[dict[str, Any]]:
    """Shapes and dtypes of the tensors the model was called with (after any --dtype cast)."""
    return [
        {"shape": list(t.shape), "dtype": dtype_name(t.dtype)}
        for t in inputs
        if isinstance(t, torch.Tensor)
    ]


def _known_storage_kinds(workload: Workload) -> dict[int, tuple[str, str | None]]:
    kinds: dict[int, tuple[str, str | None]] = {}
    for n, p in workload.model.named_parameters():
        kinds[id(p.untyped_storage())] = (KIND_PARAM, n)
    for n, b in workload.model.named_buffers():
        kinds[id(b.untyped_storage())] = (KIND_BUFFER, n)
    from torch.utils._pytree import tree_flatten

    for t in tree_flatten(workload.inputs)[0]:
        if isinstance(t, torch.Tensor):
            kinds.setdefault(id(t.untyped_storage()), (KIND_INPUT, None))
    return kinds


def _classify_late_storages(recorder: OpRecorder, model: torch.nn.Module, optimizer: Any) -> None:
    """Gradients and optimizer state are only recognizable once the step has run."""
    for p in model.parameters():
        if p.grad is not None:
            recorder.storages[recorder.storage_id(p.grad, None)].kind = KIND_GRAD
    if optimizer is not None:
        for state in optimizer.state.values():
            for v in state.values():
                if isinstance(v, torch.Tensor):
                    recorder.storages[recorder.storage_id(v, None)].kind = KIND_OPT_STATE


def _cast(workload: Workload, dtype: str | None) -> Workload:
    if dtype is None:
        return workload
    target = DTYPES[dtype]
    # Module.to() swaps tensor subclasses in place (swap_tensors), which fake tensors refuse
    # while the fake mode holds weak references to them; rebinding each tensor avoids that.
    # A memo keeps tied weights (e.g. GPT-2's lm_head and wte) tied.
    cast: dict[int, torch.nn.Parameter] = {}
    for module in workload.model.modules():
        for name, p in module._parameters.items():
            if p is not None and p.is_floating_point():
                if id(p) not in cast:
                    cast[id(p)] = torch.nn.Parameter(p.detach().to(target), p.requires_grad)
                module._parameters[name] = cast[id(p)]
        for name, b in module._buffers.items():
            if b is not None and b.is_floating_point():
                module._buffers[name] = b.to(target)
    workload.inputs = tuple(
        t.to(target) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
        for t in workload.inputs
    )
    return workload


def _make_optimizer(model: torch.nn.Module, options: TraceOptions):
    params = [p for p in model.parameters() if p.requires_grad]
    if options.optimizer == "none" or not params:
        return None
    impl = {"foreach": {"foreach": True}, "single": {"foreach": False}, "fused": {"fused": True}}[
        options.optimizer_impl
    ]
    if options.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=1e-3, **impl)
    if options.optimizer == "adam":
        return torch.optim.Adam(params, lr=1e-3, **impl)
    momentum = 0.9 if options.optimizer == "sgd-momentum" else 0.0
    return torch.optim.SGD(params, lr=1e-2, momentum=momentum, **impl)


def _initialize_state(model: torch.nn.Module, optimizer: Any, scaler: TracedGradScaler | None) -> None:
    """Run one unrecorded step so the traced step is the steady state (state already exists,
    and a GradScaler's scale and growth tracker too)."""
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.zeros_like(p)
    if scaler is None:
        optimizer.step()
    else:
        with scaler.finite:
            scaler.warm_up(optimizer, like=params[0])
    for p in params:
        p.grad = None


def _allocate_grads(model: torch.nn.Module) -> None:
    """Give every trainable parameter a zero gradient, so backward accumulates into it."""
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)


def _data_dependent_error(err: Exception, recorder: OpRecorder, modules: ModuleStack) -> TraceError:
    op = recorder.current_func
    op_text = op._schema.name if op is not None else "an operation"
    where = recorder.module_path() or "(top level)"
    return TraceError(
        f"the model's control flow or output shapes depend on tensor values: {op_text} in "
        f"module '{where}' cannot run on fake tensors ({type(err).__name__}). "
        "Ways forward: rerun with --real to trace on small real CPU tensors (the model must fit "
        "in host memory), or make the shape explicit in the model (e.g. a fixed expert capacity "
        "instead of data-dependent routing)."
    )


@contextlib.contextmanager
def _quiet_fake_tensor_log() -> Iterator[None]:
    """Silence the fake-tensor logger while tracing, then restore its level.

    FakeTensorMode logs every failing meta kernel at ERROR level with a full traceback
    (about twenty lines per failure) before the exception propagates; nnperf reports that
    failure as one line, so the log would only bury it.
    """
    logger = logging.getLogger(_FAKE_TENSOR_LOGGER)
    previous = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(previous)


def _failure_site(err: BaseException, recorder: OpRecorder) -> tuple[str, Any]:
    """Who raised ``err`` while the model's step ran: ``("op", func)`` when an aten op the
    model called rejected its arguments (a shape or dtype mismatch), ``("nnperf", None)``
    when nnperf's own tracing code raised it (a bug: keep the traceback), ``("model", None)``
    when the model's Python code (or a library it calls) raised it.

    Decided by the innermost frame of the traceback that is neither PyTorch nor the standard
    library. The recorder's dispatch frame counts as the op's when the frame it called is
    the op itself (``current_func``, left set by the failing op); the function mode's frame
    counts as the model's (PyTorch rejected the arguments of a function the model called
    before any aten op ran).
    """
    frames = []
    tb = err.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    # PyTorch wraps a dispatch mode's method (no dynamo inside); its frame runs the original
    dispatch = inspect.unwrap(type(recorder).__torch_dispatch__).__code__
    for i in range(len(frames) - 1, -1, -1):
        code = frames[i].f_code
        if code is dispatch:
            func = recorder.current_func
            callee = frames[i + 1] if i + 1 < len(frames) else None
            if func is not None and callee is not None and callee.f_locals.get("self") is func:
                return "op", func
            return "nnperf", None
        if code is GraphLabeler.__torch_function__.__code__:
            return "model", None
        # nnperf first: installed under the interpreter's own lib folder, it is in "stdlib"
        if code.co_filename.startswith(_NNPERF_INTERNALS):
            return "nnperf", None
        if code.co_filename.startswith(_PASS_THROUGH):
            continue
        return "model", None
    return "model", None


def _raised_by_nnperf(err: BaseException, recorder: OpRecorder) -> bool:
    """Whether ``err`` is a bug of nnperf's tracing code rather than a failure of the model."""
    return _failure_site(err, recorder)[0] == "nnperf"


def _model_failed_error(
    err: Exception,
    part: str,
    workload: Workload,
    recorder: OpRecorder,
    modules: ModuleStack,
    names: dict[int, str],
    options: TraceOptions,
) -> TraceError:
    """One line for a model that fails on the inputs it was given: the module and the aten op
    that failed, PyTorch's reason, the inputs and what the failing module expects.

    The module comes from the module stack: a forward that raises never runs the exit hook
    that would pop it, so the innermost module still on the stack is where it failed.
    """
    model = workload.model
    site, func = _failure_site(err, recorder)
    reason = " ".join(str(err).split())
    if site != "op" or not isinstance(err, RuntimeError):
        reason = f"{type(err).__name__}: {reason}" if reason else type(err).__name__
    module = None
    if part == "forward":
        path = modules.current()
        by_name = {names[id(m)]: m for m in model.modules()}
        module = by_name.get(path)
        if path and module is not None:
            where = f"in module '{path}' ({type(module).__name__})"
        elif path:
            where = f"in module '{path}'"
        else:
            where = f"in its forward ({type(model).__name__}.forward)"
    elif part == "loss":
        where = "in the loss function"
    else:
        where = "in the backward pass"
    if func is not None:
        where += f", op {getattr(func, 'overloadpacket', func)}"
    given = ", ".join(
        f"{dtype_name(t.dtype)}[{', '.join(str(int(s)) for s in t.shape)}]"
        for t in workload.inputs
        if isinstance(t, torch.Tensor)
    ) or "no tensors"
    hint = f"inputs given: {given}"
    if part == "forward":
        failing = module if module is not None else model
        expects = _expects(failing)
        if expects:
            hint += f"; {type(failing).__name__} '{modules.current()}' expects {expects}"
        else:
            hint += f"; {_signature(failing)}"
    if part == "loss":
        action = "check the loss function (the default sums the model's floating outputs)"
    elif type(model).__module__.startswith("nnperf.zoo"):
        action = "check the built-in model's -O options"
    else:
        action = "check the inputs (--input-shape/--tokens, a factory's inputs or inputs=)"
    if site == "model" and not options.real:
        action += "; if the model needs real tensor values, rerun with --real"
    return TraceError(
        f"{type(model).__name__}: the model failed on the given inputs {where}: {reason} "
        f"— {action} ({hint})"
    )


def _expects(module: nn.Module) -> str | None:
    """What a common layer accepts, to put beside a mismatch it raised."""
    if isinstance(module, nn.Linear):
        return f"floating inputs whose last dimension is in_features={module.in_features}"
    if isinstance(module, nn.modules.conv._ConvNd):
        spatial = {1: "L", 2: "H, W", 3: "D, H, W"}.get(len(module.kernel_size), "...")
        return f"floating (N, in_channels={module.in_channels}, {spatial}) inputs"
    if isinstance(module, nn.Embedding):
        return f"integer ids below num_embeddings={module.num_embeddings}"
    if isinstance(module, nn.LayerNorm):
        return f"inputs ending in normalized_shape={list(module.normalized_shape)}"
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        return f"inputs with num_features={module.num_features} channels in dimension 1"
    return None


def _signature(module: nn.Module) -> str:
    """``Net.forward(x, y)``: which arguments a failing module's forward takes."""
    try:
        params = str(inspect.signature(module.forward))
    except (TypeError, ValueError):
        params = "(...)"
    return f"{type(module).__name__}.forward{params}"
