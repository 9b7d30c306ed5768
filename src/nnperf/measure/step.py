"""One real step of a workload on a device: the same step the trace records, for real.

The builder comes from ``nnperf.loading.resolve`` (the trace calls the same builder inside
fake mode); here it is called outside fake mode, so weights and inputs are real random
tensors, then moved to the device. The step is ``trace.step.Step``, the one the trace records:
forward (under autocast with ``--amp``), the loss, backward (through a GradScaler for fp16
autocast), the optimizer step, and ``zero_grad`` (set to None, as the traced step starts
without gradients; kept with ``grads_persist``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from nnperf.errors import UsageError
from nnperf.trace.grad_scaler import TracedGradScaler
from nnperf.trace.options import DTYPES, TraceOptions
from nnperf.trace.rebind import rebind_tensors
from nnperf.trace.step import Step, optimizer_state, to_channels_last
from nnperf.workload import Workload, default_loss


@dataclass
class RealStep:
    """A built workload on a device and a callable that runs one step of it."""

    workload: Workload
    device: torch.device
    options: TraceOptions
    optimizer: torch.optim.Optimizer | None
    run: Callable[[], Any]
    scaler: TracedGradScaler | None = None
    step: Step | None = None

    def state_tensors(self) -> list[Any]:
        """Every tensor the loop keeps between steps: weights and their gradients, buffers,
        optimizer and scaler state, the batch, and tensors the loss holds (targets)."""
        model = self.workload.model
        tensors: list[Any] = []
        for p in model.parameters():
            tensors += [p, p.grad]
        tensors += list(model.buffers())
        if self.optimizer is not None:
            for state in optimizer_state(self.optimizer).values():
                tensors += tree_flatten(state)[0]
        if self.scaler is not None:
            tensors += list(self.scaler.state_tensors().values())
        tensors += tree_flatten(self.workload.inputs)[0]
        return tensors + _held_tensors(self.workload.loss_fn)


def _to_device(value: Any, device: torch.device, dtype: torch.dtype | None) -> Any:
    if isinstance(value, torch.Tensor):
        if dtype is not None and value.is_floating_point():
            return value.to(device=device, dtype=dtype)
        return value.to(device)
    if isinstance(value, tuple):
        return tuple(_to_device(v, device, dtype) for v in value)
    if isinstance(value, list):
        return [_to_device(v, device, dtype) for v in value]
    if isinstance(value, dict):
        return {k: _to_device(v, device, dtype) for k, v in value.items()}
    return value


def build_step(build: Callable[[], Workload], options: TraceOptions, device: torch.device,
               wrap: Callable[[Workload], Workload] | None = None) -> RealStep:
    """Build the workload for real on ``device`` and return its step function; ``wrap``: what
    the placed workload goes through before its step is made (a layout's engines:
    ``measure.distributed``).

    The builder runs with ``device`` as the default device, so weights are initialised there
    (random init of a 7B model on one CPU thread takes minutes; on a GPU, a second); what it
    still creates elsewhere is moved. Tensors are rebound rather than moved with
    ``Module.to``, which also works under a fake mode (PyTorch's RuntimeEstimator)."""
    options.validate()
    if options.fp8:
        raise UsageError("--fp8 is predicted, not measured: nnperf runs the step with the model's own layers, "
                         "and FP8 linears are Transformer Engine's or torchao's; measure without --fp8")
    if options.pointwise != "eager":
        raise UsageError(f"--pointwise {options.pointwise} is predicted, not measured: nnperf runs the model's "
                         "blocks eagerly, as written; measure without --pointwise")
    with torch.device(device):
        workload = build()
    dtype = DTYPES[options.dtype] if options.dtype else None
    model = rebind_tensors(workload.model, device=device, dtype=dtype)
    workload.model = model
    workload.inputs = _to_device(tuple(workload.inputs), device, dtype)
    if options.channels_last:
        workload.inputs = to_channels_last(model, workload.inputs)
    loss_fn = workload.loss_fn or default_loss
    # Loss functions built by the zoo may hold target tensors created on the CPU.
    if isinstance(loss_fn, nn.Module):
        loss_fn.to(device)
    _move_closure_tensors(loss_fn, device)
    if wrap is not None:
        workload = wrap(workload)
        model = workload.model
    step = Step.of(model, workload.inputs, loss_fn, options, device_type=device.type)
    return RealStep(workload=workload, device=device, options=options, optimizer=step.optimizer,
                    run=step.run, scaler=step.scaler, step=step)


def _held_tensors(fn: Any) -> list[Any]:
    """Tensors a loss object keeps as attributes, buffers or closure variables."""
    if fn is None:
        return []
    held = list(vars(fn).values()) if hasattr(fn, "__dict__") else []
    if isinstance(fn, nn.Module):
        held += [*fn.buffers(), *fn.parameters()]
    held += [cell.cell_contents for cell in getattr(fn, "__closure__", None) or ()]
    return [t for t in held if isinstance(t, torch.Tensor)]


def _move_closure_tensors(fn: Any, device: torch.device) -> None:
    """Move tensors a loss object keeps as attributes (targets, class weights) to ``device``."""
    for name, value in list(getattr(fn, "__dict__", {}).items()):
        if isinstance(value, torch.Tensor) and value.device != device:
            with contextlib.suppress(AttributeError, TypeError):
                setattr(fn, name, value.to(device))
