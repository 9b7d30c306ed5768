"""Capture one inference forward or one whole training step of a workload as a Trace.

Everything runs under ``FakeTensorMode``: weights, activations and gradients have shapes
and dtypes but no memory, so a 7B-parameter model traces on a laptop. ``real=True`` runs
the same recording on real CPU tensors, the way forward for models whose control flow
depends on data (``nonzero``, ``.item()``, expert routing).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
    UnsupportedOperatorException,
)
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

from nnperf.errors import TraceError, UsageError
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
    with fake_mode if fake_mode is not None else contextlib.nullcontext():
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
    try:
        with modules, GraphLabeler(modules), recorder, grad:
            with amp:
                output = model(*workload.inputs)
                if options.train:
                    modules.push("(loss)")
                    loss = (workload.loss_fn or default_loss)(output)
                    modules.pop()
            if options.train:
                if scaler is not None:
                    modules.push(GRAD_SCALER_MODULE)
                    loss = scaler.scale(loss)
                    modules.pop()
                recorder.phase = "backward"
                accumulation.watch_graph([loss])
                loss.backward()
                accumulation.reset()
                del loss, output  # a training loop drops them before the optimizer step
                if optimizer is not None and scaler is not None:
                    _scaled_optimizer_step(scaler, optimizer, recorder, modules)
                elif optimizer is not None:
                    recorder.phase = "optimizer"
                    optimizer.step()
    except _DATA_DEPENDENT as err:
        raise _data_dependent_error(err, recorder, modules) from None
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
