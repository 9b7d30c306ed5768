"""``torch.amp.GradScaler`` in traced fp16 training steps.

Every real fp16 mixed-precision loop scales the loss (fp16 gradients would underflow
otherwise) and runs ``scaler.scale(loss).backward(); scaler.step(optimizer);
scaler.update()``. That costs a multiply, a multi-tensor kernel that reads and writes every
gradient (``_amp_foreach_non_finite_check_and_unscale_``), a handful of 0-dim device
tensors, a one-thread kernel (``_amp_update_scale_``) and, for non-fused optimizers, a
device-to-host sync: ``scaler.step`` reads ``found_inf`` with ``.item()`` to decide whether
to step. The tracer runs PyTorch's own GradScaler so its op sequence is the real one
(the scaler's code is device-agnostic; "cpu" is the tracer's fake device).

Two things need care:

- ``.item()`` of a fake tensor has no value. ``AssumeFiniteGradients`` answers the
  scaler's found-inf read with 0.0 (no inf/NaN: the steady state, in which the optimizer
  step runs): as a dispatch mode in the unrecorded warm-up step, through
  ``OpRecorder.answer`` in the recorded one (which records the read as the host sync it is,
  and spares every other op of the step a second Python dispatch layer);
- phases: work the scaler issues before ``optimizer.step`` is recorded in the backward
  phase (gradient post-processing on the device, and the passes read 0-dim tensors of the
  optimizer phase as the host-side step counters of PyTorch's optimizers, which the scaler's
  tensors are not); ``update`` after the optimizer step is recorded in the optimizer phase.
  Both carry the ``(grad_scaler)`` pseudo-module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

GRAD_SCALER_MODULE = "(grad_scaler)"

LOCAL_SCALAR_DENSE = torch.ops.aten._local_scalar_dense.default


class AssumeFiniteGradients(TorchDispatchMode):
    """While armed, ``.item()`` returns 0.0: "no inf or NaN found in the gradients".

    Armed only while the scaler itself runs, never inside ``optimizer.step``, whose
    step-counter reads must keep their values. Real tensors (``--real``) get the same
    answer, so a real-mode trace has the same ops whatever the random gradients hold.
    """

    def __init__(self) -> None:
        super().__init__()
        self.armed = False

    def answer(self, func: Any) -> float | None:
        """The value of ``func`` if this mode decides it, else None (run the op)."""
        if self.armed and func is LOCAL_SCALAR_DENSE:
            return 0.0
        return None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = self.answer(func)
        return func(*args, **(kwargs or {})) if out is None else out


class TracedGradScaler:
    """A real ``torch.amp.GradScaler`` plus what tracing it on fake tensors needs (the
    measured step runs the same object on real tensors: unused there, it changes nothing)."""

    def __init__(self, device_type: str = "cpu") -> None:
        # The scale tensor's device comes from the loss (lazily, on the first scale()); the
        # tracer's "cpu" also avoids the CUDA-availability check that would disable the scaler.
        self.scaler = torch.amp.GradScaler(device_type)
        self.finite = AssumeFiniteGradients()

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """``scaler.scale(loss)``: one multiply once the scale tensor exists."""
        return self.scaler.scale(loss)

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """``scaler.unscale_(optimizer)`` before clipping: the unscale and inf check run here,
        and ``step`` then only reads the result."""
        from nnperf.trace.diagnosis import quiet_redistribute

        with quiet_redistribute():
            self.scaler.unscale_(optimizer)

    def step(
        self,
        optimizer: torch.optim.Optimizer,
        on_optimizer_start: Callable[[], None] = lambda: None,
        on_optimizer_end: Callable[[], None] = lambda: None,
    ) -> None:
        """``scaler.step(optimizer); scaler.update()`` with the callbacks around the
        optimizer's own step (the recorder switches phase and module there)."""

        def pre(*_: Any) -> None:
            self.finite.armed = False
            on_optimizer_start()

        def post(*_: Any) -> None:
            on_optimizer_end()

        from nnperf.trace.diagnosis import quiet_redistribute

        handles = [optimizer.register_step_pre_hook(pre), optimizer.register_step_post_hook(post)]
        self.finite.armed = True
        try:
            with quiet_redistribute():
                self.scaler.step(optimizer)
        finally:
            self.finite.armed = False
            for h in handles:
                h.remove()
        self.scaler.update()

    def warm_up(self, optimizer: torch.optim.Optimizer, like: torch.Tensor) -> None:
        """An unrecorded scaled step (gradients must be set) so the traced step is the steady
        state: the scale and growth tracker exist, the optimizer state too."""
        self.scale(torch.zeros((), dtype=torch.float32, device=like.device))
        self.step(optimizer)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """The scaler's persistent device tensors (created by the first ``scale``)."""
        return scaler_state_tensors(self.scaler)


def scaler_state_tensors(scaler: torch.amp.GradScaler) -> dict[str, torch.Tensor]:
    """A GradScaler's persistent tensors, once its first ``scale`` created them: what a
    training loop keeps between steps besides the model and the optimizer."""
    out = {"scale": scaler._scale, "growth_tracker": scaler._growth_tracker}
    return {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}
