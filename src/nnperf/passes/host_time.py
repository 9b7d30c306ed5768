"""The host's time per traced event of an eager step, added up from its parts.

Eager PyTorch issues every kernel from one host thread, and on small models or small batches
that thread, not the GPU, sets the step time. What it spends is not one bare op's cost per op
(what a tight loop of ``torch.add`` measures): inside a real step an op may be called from
Python or dispatched from C++ by another op, autocast or the backward engine; it may record
an autograd node; ``nn.Module`` calls wrap it; the backward engine runs a node for it; the
optimizer runs Python per parameter; ``zero_grad`` loops over the parameters; ``.item()``
waits for the device and pays a round trip; and a stream of different ops runs colder in the
CPU's caches than a loop of one (``host_in_context``). Each part is a measured constant of
the host (``measure.calibration.host_parts``, ``nnperf calibrate``); the trace counts each
part per event (``trace.events.OpEvent``), and ``HostCosts.event_s`` adds them up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nnperf.hardware import DeviceProfile
    from nnperf.trace.events import OpEvent

#: The optimizer the step runs as the host cost table names it (``host_optimizer_*``): Adam
#: and AdamW share their implementation's Python, so do SGD with and without momentum.
OPTIMIZER_FAMILY = {"adamw": "adamw", "adam": "adamw", "sgd": "sgd-momentum", "sgd-momentum": "sgd-momentum"}


@dataclass(frozen=True)
class OptimizerCost:
    """The host time of one ``optimizer.step()``: a fixed part and a part per parameter."""

    step_s: float
    param_s: float

    def seconds(self, params: int) -> float:
        return self.step_s + params * self.param_s


@dataclass(frozen=True)
class HostCosts:
    """One host's cost of each part of an eager step (seconds; see ``default_profile.toml``
    for each value's source)."""

    op_s: float  # a small op called from Python (tight loop)
    by_kind: dict[str, float]  # the same per op category, where measured
    view_s: float  # a view called from Python (tight loop)
    python_call_s: float  # what a call from Python adds over the same op from C++
    autograd_record_s: float
    view_autograd_s: float
    module_call_s: float
    module_hook_s: float
    autocast_op_s: float
    backward_node_s: float
    backward_call_s: float
    zero_grad_param_s: float
    sync_s: float
    in_context: float  # a kernel-launching op in a stream of different ops over a tight loop's
    kernel_launch_s: float  # each further kernel an op launches
    dtensor_dispatch_s: float
    dtensor_list_tensor_s: float
    optimizers: dict[str, OptimizerCost] = field(default_factory=dict)

    @classmethod
    def of(cls, profile: DeviceProfile) -> HostCosts:
        steps, params = profile.host_optimizer_step_s, profile.host_optimizer_param_s
        return cls(
            op_s=profile.host_dispatch_s, by_kind=dict(profile.host_dispatch_by_kind_s),
            view_s=profile.host_view_s, python_call_s=profile.host_python_call_s,
            autograd_record_s=profile.host_autograd_record_s, view_autograd_s=profile.host_view_autograd_s,
            module_call_s=profile.host_module_call_s, module_hook_s=profile.host_module_hook_s,
            autocast_op_s=profile.host_autocast_op_s, backward_node_s=profile.host_backward_node_s,
            backward_call_s=profile.host_backward_call_s,
            zero_grad_param_s=profile.host_zero_grad_param_s, sync_s=profile.host_sync_s,
            in_context=profile.host_in_context, kernel_launch_s=profile.kernel_overhead_s,
            dtensor_dispatch_s=profile.host_dtensor_dispatch_s,
            dtensor_list_tensor_s=profile.host_dtensor_list_tensor_s,
            optimizers={k: OptimizerCost(steps[k], params[k]) for k in steps if k in params},
        )

    def optimizer(self, name: str, impl: str) -> OptimizerCost | None:
        """The measured step of ``name`` in ``impl``, or None where this host has none (its
        ops are then priced one by one)."""
        return self.optimizers.get(f"{OPTIMIZER_FAMILY.get(name, name)}/{impl}")

    def _launching_op(self, kind: str | None, python_call: bool) -> float:
        """A kernel-launching op of category ``kind`` in a stream of different ops: its tight
        loop's cost from Python, less the Python call where C++ dispatched it."""
        from_python = self.by_kind.get(kind, self.op_s) if kind else self.op_s
        cost = from_python if python_call else max(0.0, from_python - self.python_call_s)
        return cost * self.in_context

    def event_s(self, event: OpEvent, kind: str | None, *, host_value: bool = False,
                autocast: bool = False) -> float:
        """Host seconds of ``event`` (a view when ``kind`` is None; ``host_value``: an op that
        reads or writes host memory only, the optimizer's step counters; ``autocast``: run
        inside ``torch.autocast``), with the module calls that led to it and the autograd
        node it records."""
        if kind is None or host_value:
            base = self.view_s if event.python_call else max(0.0, self.view_s - self.python_call_s)
            grad = self.view_autograd_s if event.records_grad else 0.0
        else:
            base = self._launching_op(kind, event.python_call)
            grad = self.autograd_record_s if event.records_grad else 0.0
        cast = self.autocast_op_s if autocast and event.python_call else 0.0
        modules = event.module_calls * self.module_call_s + event.module_hooks * self.module_hook_s
        return base + grad + cast + modules + self.subclass_s(event)

    def compiled_event_s(self, kind: str | None) -> float:
        """Host seconds of an op inside a compiled block (``OpEvent.block_call``; ``kind``
        None: a view): Inductor's generated wrapper calls each kernel from Python (a Triton
        kernel's launcher, a library op such as ``extern_kernels.mm``, a functional collective)
        on plain tensors, with no autograd node, module call, autocast or DTensor dispatch of its
        own, all traced away when the block was compiled; a view costs nothing (Inductor
        resolves it while compiling). Not counted: Dynamo's guard check on each call of the
        block."""
        return 0.0 if kind is None else self._launching_op(kind, python_call=True)

    def compiled_call_s(self) -> float:
        """A compiled block's own call: the one autograd node AOTAutograd's function records for
        the whole block (its backward is that one node's). The block's module call is the op's
        that takes it (``OpEvent.module_calls``): FSDP2's pre-forward hook's first op, eager;
        without such a hook the block's first op, whose module calls a compiled block does not
        charge, so that one call (a microsecond) is not counted."""
        return self.autograd_record_s

    def subclass_s(self, event: OpEvent) -> float:
        """What a tensor subclass's dispatch (DTensor: tensor parallelism, FSDP2's sharded
        parameters) adds to ``event`` on the host, on top of the op beneath it: also charged
        where the op's own price is a measured whole (an optimizer step timed on plain tensors)."""
        return (event.subclass_dispatches * self.dtensor_dispatch_s
                + event.subclass_list_tensors * self.dtensor_list_tensor_s)

    def node_s(self) -> float:
        """The backward engine's own cost for one node (on top of the ops it dispatches)."""
        return self.backward_node_s

    def zero_grad_s(self, params: int) -> float:
        """``optimizer.zero_grad(set_to_none=True)`` over ``params`` parameters."""
        return params * self.zero_grad_param_s
