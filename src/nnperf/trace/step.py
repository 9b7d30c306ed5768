"""One step of a workload, described once: what nnperf traces and what it measures.

A training step is the loop every PyTorch user writes::

    with autocast:                       # --amp
        output = model(*inputs)
        loss = loss_fn(output)
    loss = scaler.scale(loss)            # fp16 autocast: a GradScaler
    loss.backward()                      # the output stays referenced through backward
    del loss, output                     # dropped before the optimizer step
    scaler.unscale_(optimizer); clip_grad_norm(...)   # --clip-grad-norm (trace.clip)
    scaler.step(optimizer); scaler.update()   # or optimizer.step()
    optimizer.zero_grad(set_to_none=...)      # closes the step (the next one's start state)

and an inference step is the forward under ``torch.no_grad()``. ``trace.capture`` runs
``Step.run`` under the recorder on fake tensors, ``measure.step`` runs the same ``Step.run``
on real tensors on a device, so the two cannot drift apart: the optimizer (``make_optimizer``),
autocast, the scaler, the order of the parts and what is alive when are decided here only.

The tracer needs to know where each part starts (to attribute ops to the loss, the scaler and
the optimizer, and to switch the phase); ``StepWatch`` is told, and does nothing by default.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from nnperf.errors import UsageError
from nnperf.trace.clip import APART_NORM, CLIP_MODULE, NORM_GROUPS, clip_grad_norm
from nnperf.trace.grad_scaler import TracedGradScaler
from nnperf.trace.loss import ChunkedLoss, loss_for
from nnperf.trace.options import AMP_DTYPES, TraceOptions
from nnperf.trace.rebind import rebind_tensors

#: The optimizers' hyper-parameters: they change no op or tensor, only values.
_LEARNING_RATE = {"adamw": 1e-3, "adam": 1e-3, "sgd": 1e-2, "sgd-momentum": 1e-2}
_IMPLEMENTATIONS: dict[str, dict[str, bool]] = {
    "foreach": {"foreach": True}, "single": {"foreach": False}, "fused": {"fused": True},
}


def to_channels_last(model: nn.Module, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """``model.to(memory_format=torch.channels_last)`` and the same for 4-D floating inputs,
    as PyTorch's channels_last recipe does; the model is changed in place (its tensors rebound,
    which works on fake tensors too), the inputs returned. A model with no 4-D weight, buffer
    or floating input has nothing the format changes: refused, like every setting that would
    not reach the model."""
    if not any(isinstance(t, torch.Tensor) and t.dim() == 4 and t.is_floating_point()
               for t in (*model.parameters(), *model.buffers(), *inputs)):
        raise UsageError("--channels-last changes nothing here: the model has no 4-D weight or image input "
                         "(channels_last is the NHWC memory format of CNNs' convolutions); leave it out")
    rebind_tensors(model, memory_format=torch.channels_last)
    return tuple(
        t.contiguous(memory_format=torch.channels_last)
        if isinstance(t, torch.Tensor) and t.dim() == 4 and t.is_floating_point() else t
        for t in inputs
    )


def make_optimizer(model: nn.Module, options: TraceOptions) -> Any:
    """The optimizer of the step (None: ``--optimizer none``, or nothing to train). On a model
    a ZeRO-1 layout wrapped (``SHARDED_BUCKETS``: Megatron-LM's distributed optimizer,
    ``trace.parallel.distributed_optimizer``) it updates this rank's share of each bucket only."""
    params = [p for p in model.parameters() if p.requires_grad]
    if options.optimizer == "none" or not params:
        return None
    kwargs: dict[str, Any] = {"lr": _LEARNING_RATE[options.optimizer], **_IMPLEMENTATIONS[options.optimizer_impl]}
    optimizer_class: type[torch.optim.Optimizer]
    if options.optimizer in ("adamw", "adam"):
        optimizer_class = torch.optim.AdamW if options.optimizer == "adamw" else torch.optim.Adam
    else:
        optimizer_class = torch.optim.SGD
        kwargs["momentum"] = 0.9 if options.optimizer == "sgd-momentum" else 0.0
    from nnperf.trace.parallel.distributed_optimizer import SHARDED_BUCKETS, DistributedOptimizer

    sharded = getattr(model, SHARDED_BUCKETS, None)
    if sharded:
        return DistributedOptimizer(optimizer_class, kwargs, sharded)
    return optimizer_class(params, **kwargs)


def gradient_params(optimizer: Any) -> list[torch.Tensor]:
    """The parameters whose gradients backward leaves for the optimizer step (what clipping
    scales): the optimizer's own, or a distributed optimizer's (``DistributedOptimizer.
    gradient_params``: its shares of the model's buckets, or their fp32 main parameters where
    the buckets reduce fp32 main gradients)."""
    from nnperf.trace.parallel.distributed_optimizer import DistributedOptimizer

    if isinstance(optimizer, DistributedOptimizer):
        return optimizer.gradient_params()
    return [p for group in optimizer.param_groups for p in group["params"]]


def unheld_gradients(optimizer: Any) -> list[torch.Tensor]:
    """The model's parameters whose gradients the modelled engine does not hold (a distributed
    optimizer's 16-bit buckets beside fp32 main gradients: ``DistributedOptimizer.
    unheld_gradients``); none elsewhere."""
    from nnperf.trace.parallel.distributed_optimizer import DistributedOptimizer

    return optimizer.unheld_gradients() if isinstance(optimizer, DistributedOptimizer) else []


def optimizer_state(optimizer: Any) -> dict[Any, dict[str, Any]]:
    """The per-parameter state this rank holds (a distributed optimizer's: its shares')."""
    return optimizer.state


class StepWatch:
    """Told where each part of ``Step.run`` starts and ends; does nothing here.

    The scaler's own work and the optimizer's alternate: with a scaler, ``scaler_starts``
    comes before ``scale``, before its unscale and again before its ``update``, and
    ``scaler_ends`` before ``optimizer_starts`` and after ``update``.
    """

    def loss_starts(self) -> None: ...
    def loss_ends(self) -> None: ...
    def scaler_starts(self) -> None: ...
    def scaler_ends(self) -> None: ...
    def clip_starts(self) -> None: ...
    def clip_ends(self) -> None: ...
    def backward_starts(self, loss: torch.Tensor) -> None: ...
    def backward_ends(self) -> None: ...
    def optimizer_starts(self) -> None: ...
    def optimizer_ends(self) -> None: ...
    def action_starts(self, label: str, phase: str, roots: list[Any] | None = None) -> None:
        """A pipeline schedule's action starts (``F3@1``: stage 1's forward of micro-batch 3);
        ``phase`` forward or backward, ``roots`` the tensors a backward action starts from."""

    def action_ends(self) -> None: ...


_QUIET = StepWatch()


def once_per_step(event: Any) -> bool:
    """Whether a traced op runs once per optimizer step however many micro-batches accumulate
    gradients: the optimizer's, and gradient clipping's (recorded in the backward phase, under
    its pseudo-module, so its 0-dim tensors are not read as an optimizer's host counters)."""
    return event.phase == "optimizer" or event.module == CLIP_MODULE


@dataclass
class Step:
    """A built workload's step: the model, its inputs and loss, and the loop's objects."""

    model: nn.Module
    inputs: tuple[Any, ...]
    loss_fn: Callable[[Any], torch.Tensor]
    options: TraceOptions
    optimizer: torch.optim.Optimizer | None
    scaler: TracedGradScaler | None
    device_type: str = "cpu"  # autocast's device
    #: Run ``zero_grad`` at the end (a measured loop). A trace stops after the optimizer:
    #: the gradients it leaves are classified as such, and the step's start state (no
    #: gradients, or gradients allocated with ``grads_persist``) is set up before it.
    zero_grad: bool = True

    @classmethod
    def of(cls, model: nn.Module, inputs: tuple[Any, ...], loss_fn: Callable[[Any], torch.Tensor],
           options: TraceOptions, device_type: str = "cpu", zero_grad: bool = True) -> Step:
        """The step ``options`` describe for a model already cast and placed: its optimizer,
        for fp16 autocast training its GradScaler, and the loss as ``--loss`` runs it."""
        model.train(options.train)
        optimizer = make_optimizer(model, options) if options.train else None
        scaler = (TracedGradScaler(device_type)
                  if optimizer is not None and options.uses_grad_scaler() else None)
        # a pipeline rank's schedule runs the loss its last stage was built with
        # (trace.distributed._pipeline_rank); the step's is not called
        loss = loss_fn if hasattr(model, "run_pipeline") else loss_for(loss_fn, options.loss, model)
        return cls(model, inputs, loss, options, optimizer, scaler, device_type, zero_grad)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if not self.options.amp:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=AMP_DTYPES[self.options.amp])

    def run(self, watch: StepWatch = _QUIET) -> Any:
        """One step. Returns an inference step's output (None for training): the caller
        decides when it is dropped (a trace keeps it past the end of the recording)."""
        with sdpa_backend(self.options.sdpa):
            return self._run(watch)

    def _run(self, watch: StepWatch) -> Any:
        if not self.options.train:
            with torch.no_grad(), self.autocast():
                return self.model(*self.inputs)
        scaler, optimizer = self.scaler, self.optimizer
        run_pipeline = getattr(self.model, "run_pipeline", None)
        if run_pipeline is not None:  # a pipeline rank: its schedule runs forward, loss and backward
            run_pipeline(self.autocast, watch)
        else:
            with self.autocast(), _quiet_head_view(self.loss_fn):
                output = self.model(*self.inputs)
                watch.loss_starts()
                loss = self.loss_fn(output)
                watch.loss_ends()
            if scaler is not None:
                watch.scaler_starts()
                loss = scaler.scale(loss)
                watch.scaler_ends()
            watch.backward_starts(loss)
            loss.backward()
            watch.backward_ends()
            del loss, output  # a training loop drops them before the optimizer step
        if optimizer is not None and self.options.clip_grad_norm is not None:
            watch.clip_starts()
            if scaler is not None:  # the norm of the true gradients: unscaled first
                scaler.unscale_(optimizer)
            clip_grad_norm(gradient_params(optimizer), self.options.clip_grad_norm,
                           getattr(self.model, "group", None) if run_pipeline is not None else None,
                           tuple(getattr(self.model, NORM_GROUPS, ())), getattr(self.model, APART_NORM, None))
            watch.clip_ends()
        if optimizer is not None and scaler is not None:
            watch.scaler_starts()
            scaler.step(optimizer, lambda: _both(watch.scaler_ends, watch.optimizer_starts),
                        lambda: _both(watch.optimizer_ends, watch.scaler_starts))
            watch.scaler_ends()
        elif optimizer is not None:
            watch.optimizer_starts()
            optimizer.step()
            watch.optimizer_ends()
        if self.zero_grad:  # with grads_persist the next step starts with gradients allocated
            owner = optimizer if optimizer is not None else self.model
            owner.zero_grad(set_to_none=not self.options.grads_persist)
        return None


def _quiet_head_view(loss_fn: Any) -> contextlib.AbstractContextManager[Any]:
    """A chunked loss stops the model at its final norm, and only reads what it returns."""
    if not isinstance(loss_fn, ChunkedLoss):
        return contextlib.nullcontext()
    from nnperf.trace.diagnosis import quiet_fsdp_view_warning

    return quiet_fsdp_view_warning()


@contextlib.contextmanager
def sdpa_backend(mode: str) -> Iterator[None]:
    """``--sdpa unfused`` on a device: PyTorch's math backend, in the input's dtype (what the
    trace records, ``trace.attention``); ``--sdpa cudnn``: cuDNN's kernel first in SDPA's
    priority order, the others after it in their default order (``kernels.attention``). A
    trace routes SDPA before any backend is chosen."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if mode == "cudnn":
        order = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                 SDPBackend.MATH]
        if "set_priority" not in inspect.signature(sdpa_kernel).parameters:  # torch < 2.6
            raise UsageError(f"--sdpa cudnn needs PyTorch 2.6 or later to put cuDNN first (this is "
                             f"{torch.__version__})")
        with sdpa_kernel(order, set_priority=True):
            yield
        return
    if mode != "unfused":
        yield
        return

    allow = getattr(torch.backends.cuda, "allow_fp16_bf16_reduction_math_sdp", None)
    before = torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed() if allow else None
    if allow:
        allow(True)
    try:
        with sdpa_kernel(SDPBackend.MATH):
            yield
    finally:
        if allow:
            allow(before)


def _both(first: Callable[[], None], second: Callable[[], None]) -> None:
    first()
    second()
