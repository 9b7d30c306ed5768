"""Why a traced step failed: the model's fault (one line naming the module, the aten op and
what the module expects) or nnperf's own bug (the original exception and its traceback).

Kept apart from the recording: these functions only read what the recorder and the module
stack were doing when the exception came, and decide from the traceback's frames who raised
it. Also here: the fake-tensor logger that would print a traceback for every failing meta
kernel before nnperf reports the failure as one line.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import sysconfig
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    UnsupportedOperatorException,
)
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

from nnperf.errors import TraceError
from nnperf.trace.events import dtype_name
from nnperf.trace.options import TraceOptions
from nnperf.trace.recorder import GraphLabeler, ModuleStack, OpRecorder, OpRejected
from nnperf.workload import Workload

#: Failures of a model whose control flow or output shapes depend on tensor values.
DATA_DEPENDENT = (
    DataDependentOutputException,
    DynamicOutputShapeException,
    GuardOnDataDependentSymNode,
    UnsupportedOperatorException,
)
#: Logs every failing meta kernel with a full traceback at ERROR level (~20 lines per
#: failure, often repeated): noise on top of the one-line error nnperf reports instead.
_FAKE_TENSOR_LOGGER = "torch._subclasses.fake_tensor"


def _spellings(*paths: Path) -> tuple[str, ...]:
    """Each path as written and resolved: frames name files the way they were imported."""
    return tuple(dict.fromkeys(s for p in paths for s in (str(p), str(p.resolve()))))


#: nnperf code that runs inside the model's step (dispatch and function modes, autograd
#: hooks, the GradScaler stand-in, the memory pass's recomputation): an exception raised by
#: these files themselves is a bug of nnperf, reported with its traceback, not a problem
#: of the user's model. ``capture.py`` and ``step.py`` (they only call the model) and
#: ``attention.py`` (the model's own attention, re-implemented) are left out on purpose.
_HERE = Path(__file__).parent
_NNPERF_INTERNALS = _spellings(
    _HERE / "recorder.py", _HERE / "accumulation.py", _HERE / "grad_scaler.py",
    _HERE / "events.py", _HERE.parent / "passes",
)
#: Code a model's failure passes through on its way up and that says nothing about who
#: caused it: PyTorch itself, the standard library, and the trace's fake tensor mode
#: (``routing.TraceFakeMode``, a thin subclass of PyTorch's) with the calls it replays.
_PASS_THROUGH = (
    *_spellings(Path(torch.__file__).parent, Path(sysconfig.get_paths()["stdlib"]), _HERE / "routing.py"),
    "<frozen ",
)


def data_dependent_error(err: Exception, recorder: OpRecorder, modules: ModuleStack) -> TraceError:
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
def quiet_logger(name: str, level: int) -> Iterator[None]:
    """Raise the logger ``name`` to ``level`` for the block, then restore its level."""
    logger = logging.getLogger(name)
    previous = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(previous)


def quiet_redistribute() -> contextlib.AbstractContextManager[None]:
    """DTensor warns when a redistribution takes one collective per mesh dimension (a
    gradients' norm over a data x tensor mesh; GradScaler's found-inf flag, a ``Partial(max)``
    over both, read on the host): the engines run them so and the trace records each, so the
    warning says nothing to a user of nnperf."""
    return quiet_logger("torch.distributed.tensor._redistribute", logging.ERROR)


@contextlib.contextmanager
def quiet_fsdp_view_warning() -> Iterator[None]:
    """FSDP2 (torch 2.13) warns that a wrapped module returning a view loses its pre-backward
    hook to an in-place op on that view. Used where nnperf itself consumes that output and only
    reads it: a pipeline schedule's stage outputs, and the hidden states a chunked loss takes."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "FSDP2-wrapped module .* returned a view tensor", UserWarning)
        yield


def quiet_fake_tensor_log() -> contextlib.AbstractContextManager[None]:
    """Silence the fake-tensor logger while tracing.

    FakeTensorMode logs every failing meta kernel at ERROR level with a full traceback
    (about twenty lines per failure) before the exception propagates; nnperf reports that
    failure as one line, so the log would only bury it.
    """
    return quiet_logger(_FAKE_TENSOR_LOGGER, logging.CRITICAL)


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
    if isinstance(err, OpRejected) and recorder.current_func is not None:
        return "op", recorder.current_func  # the recorder's check stands for the device kernel's
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


def raised_by_nnperf(err: BaseException, recorder: OpRecorder) -> bool:
    """Whether ``err`` is a bug of nnperf's tracing code rather than a failure of the model."""
    return _failure_site(err, recorder)[0] == "nnperf"


def model_failed_error(
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
