"""Capture one inference forward or one whole training step of a workload as a Trace.

Weights, activations and gradients have shapes and dtypes but no memory, so a 7B-parameter
model traces on a laptop: the step runs on meta tensors where it can (``trace.meta_world``:
the same trace, in about half the time), else under ``FakeTensorMode``, which keeps the
values the meta device lacks (expert routing, literals the model reads). ``real=True`` runs
the same recording on real CPU tensors, the way forward for models whose control flow
depends on data (``nonzero``, ``.item()``).

The step itself is ``trace.step.Step`` (the one ``measure`` runs for real); here it runs
under the recorder, which ``_Watch`` tells where the loss, the scaler, the backward and the
optimizer start. Why a failing step failed is ``trace.diagnosis``'s business.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from nnperf.errors import NnperfError, UsageError
from nnperf.trace import flex_attention, meta_world
from nnperf.trace import loss as traced_loss
from nnperf.trace.accumulation import AccumulationWatch, fold_inplace_accumulations
from nnperf.trace.assumptions import collecting
from nnperf.trace.attention import sdpa_mode
from nnperf.trace.autocast_cuda import CudaAutocast
from nnperf.trace.blocks import block_names, linears_in_blocks
from nnperf.trace.clip import CLIP_MODULE
from nnperf.trace.diagnosis import (
    DATA_DEPENDENT,
    data_dependent_error,
    model_failed_error,
    quiet_fake_tensor_log,
    raised_by_nnperf,
)
from nnperf.trace.events import (
    KIND_BUFFER,
    KIND_GRAD,
    KIND_INPUT,
    KIND_OPT_STATE,
    KIND_PARAM,
    KIND_UNHELD_GRAD,
    Trace,
    dtype_name,
)
from nnperf.trace.grad_scaler import GRAD_SCALER_MODULE, TracedGradScaler
from nnperf.trace.options import DTYPES, TraceOptions
from nnperf.trace.packing import mark_host
from nnperf.trace.rebind import rebind_tensors
from nnperf.trace.recorder import (
    GraphLabeler,
    KnownStorages,
    ModuleStack,
    OpRecorder,
    calls_of_blocks,
)
from nnperf.trace.routing import Routing, TraceFakeMode
from nnperf.trace.state_warmup import skip_inplace_math
from nnperf.trace.step import (
    Step,
    StepWatch,
    gradient_params,
    optimizer_state,
    to_channels_last,
    unheld_gradients,
)
from nnperf.workload import Workload, default_loss

_log = logging.getLogger(__name__)


def trace_workload(build: Callable[[], Workload], options: TraceOptions, *,
                   meta_first: bool = True) -> tuple[Trace, Workload]:
    """Build the workload inside the tracing context and record one step of it: on meta
    tensors where the step allows it (``trace.meta_world``: the same trace, faster), else on
    fakes, or on real CPU tensors with ``real``. ``meta_first=False``: fakes at once."""
    options.validate()
    if meta_first and meta_world.eligible(options):
        try:
            with quiet_fake_tensor_log(), meta_world.meta_world(options):
                on_meta = _Private(meta_world.on_meta, meta_world.on_meta)
                return _build_and_record(build, options, on_meta, "meta")
        except UsageError:  # the request itself (an option the step cannot use): fakes say the same
            raise
        except Exception as err:  # the fake trace decides, and explains a failure
            _log.debug("recording on meta tensors stopped (%s); recording on fake tensors", err)
    # Non-fake tensors a user model keeps as plain attributes (not buffers) become fakes on use.
    fake_mode = None if options.real else TraceFakeMode(allow_non_fake_inputs=True)
    with quiet_fake_tensor_log(), fake_mode if fake_mode is not None else contextlib.nullcontext():
        if fake_mode is None:
            return _build_and_record(build, options, _Private(_clone, None), "real")
        fake = _Private(functools.partial(_fake_copy, fake_mode), functools.partial(_fake_input, fake_mode))
        return _build_and_record(build, options, fake, "fake")


class _Private(NamedTuple):
    """How a trace copies what the user built: ``tensor`` for parameters and buffers (tied
    weights stay tied), ``input`` for the model's inputs (None: used as they are)."""

    tensor: Callable[[torch.Tensor], torch.Tensor]
    input: Callable[[torch.Tensor], torch.Tensor] | None


def _build_and_record(build: Callable[[], Workload], options: TraceOptions, private: _Private,
                      tensors: str) -> tuple[Trace, Workload]:
    # FlexAttention as the GPU runs it, also for what the model runs while it is built (a
    # pipeline stage's shapes)
    with flex_attention.tracing():
        workload = build()
        restore = _swap_in_private_copies(workload, private)
        try:
            return _record_built(workload, options, tensors)
        finally:
            restore()


def _record_built(workload: Workload, options: TraceOptions, tensors: str) -> tuple[Trace, Workload]:
    """The built workload in the trace's dtype and layout, its step recorded."""
    workload = cast_workload(workload, options.dtype)
    if options.channels_last:
        workload.inputs = to_channels_last(workload.model, tuple(workload.inputs))
    # "cpu" is the fake device; the trace ends after the optimizer (no zero_grad)
    step = Step.of(workload.model, workload.inputs, workload.loss_fn or default_loss,
                   options, zero_grad=False)
    if step.optimizer is not None:
        _initialize_state(step.model, step.optimizer, step.scaler)
    if options.train and options.grads_persist:
        _allocate_grads(step.model)
    trace = _record(workload, step)
    trace.config["tensors"] = tensors
    return trace, workload


def _clone(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone()


def _fake_copy(fake_mode: FakeTensorMode, t: torch.Tensor) -> torch.Tensor:
    if t.is_meta:  # built on the meta device (trace.construction): a fake on the CPU
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu")
    return fake_mode.from_tensor(t)


def _fake_input(fake_mode: FakeTensorMode, t: torch.Tensor) -> torch.Tensor:
    if not _is_host_ints(t):
        return _fake_copy(fake_mode, t)
    # a host integer input keeps its values (trace.packing)
    return mark_host(fake_mode.fake_tensor_converter.from_real_tensor(fake_mode, t, make_constant=True))


def _swap_in_private_copies(workload: Workload, private: _Private) -> Callable[[], None]:
    """Replace the parameters, buffers and inputs of a model the user already built by
    ``private`` copies (fakes, meta tensors or, with ``real``, clones) and remember each
    module's train/eval flag.

    The user's module is modified in place for the duration of the trace and restored after,
    so tracing a real model neither copies its weights (fake or meta) nor changes their values,
    gradients, running statistics or train/eval mode (the traced step runs an optimizer).
    """
    from torch._subclasses.fake_tensor import FakeTensor

    def done(value: torch.Tensor) -> bool:
        """Already private: a fake (a DTensor's local shard too), or a meta tensor on meta."""
        return (isinstance(local(value), FakeTensor)
                or (private.tensor is meta_world.on_meta and value.is_meta))

    originals: list[tuple[dict, str, Any]] = []
    copies: dict[int, torch.Tensor] = {}
    flags = [(m, m.training) for m in workload.model.modules()]
    for module in workload.model.modules():
        for table in (module._parameters, module._buffers):
            for name, value in table.items():
                if value is None or done(value):
                    continue
                copy = copies.get(id(value))
                if copy is None:  # a tied weight stays tied: one copy for all its owners
                    copy = private.tensor(value)
                    if isinstance(value, torch.nn.Parameter):
                        copy = torch.nn.Parameter(copy, requires_grad=value.requires_grad)
                    copies[id(value)] = copy
                originals.append((table, name, value))
                table[name] = copy
    real_inputs = workload.inputs
    if private.input is not None:
        workload.inputs = tuple(
            private.input(t) if isinstance(t, torch.Tensor) and not done(t) else t
            for t in workload.inputs
        )

    def restore() -> None:
        for table, name, value in originals:
            table[name] = value
        for module, training in flags:
            module.training = training
        workload.inputs = real_inputs

    return restore


def _is_host_ints(t: torch.Tensor) -> bool:
    """A 1-D integer CPU input: sequence lengths for packing, which PyTorch keeps on the host."""
    return t.dim() == 1 and t.device.type == "cpu" and t.dtype in (torch.int64, torch.int32)


class _Watch(StepWatch):
    """The recorder's side of the step: module and phase of each part, the engine's sums in
    backward, and which part runs the user's code (for the message when it fails; nnperf's
    own parts, the GradScaler and the optimizer nnperf chose, leave ``user_part`` None)."""

    def __init__(self, recorder: OpRecorder, modules: ModuleStack, accumulation: AccumulationWatch,
                 params: list[torch.Tensor]):
        self.recorder, self.modules, self.accumulation = recorder, modules, accumulation
        self.params = params  # the trainable parameters (gradients of unreached ones dropped)
        self.user_part: str | None = "forward"
        self.cuda_autocast: CudaAutocast | None = None
        self.actions: list[list[Any]] = []  # pipeline actions: [label, first event, end event]

    def loss_starts(self) -> None:
        self.user_part = "loss"
        self.modules.push("(loss)")

    def loss_ends(self) -> None:
        self.modules.pop()
        self.user_part = None

    def scaler_starts(self) -> None:
        self.modules.push(GRAD_SCALER_MODULE)

    def scaler_ends(self) -> None:
        self.modules.pop()

    def clip_starts(self) -> None:  # recorded in the backward phase, as the scaler's unscale
        self.modules.push(CLIP_MODULE)

    def clip_ends(self) -> None:
        self.modules.pop()

    def backward_starts(self, loss: torch.Tensor) -> None:
        if self.cuda_autocast is not None:  # the autocast region has ended: its casts too
            self.cuda_autocast.clear_cache()
        self.recorder.phase = "backward"
        self.accumulation.watch_graph([loss])
        self.user_part = "backward"

    def backward_ends(self) -> None:
        self.user_part = None
        self.accumulation.reset()
        _drop_unreached_grads(self.params, self.accumulation.reached)

    def optimizer_starts(self) -> None:
        self.recorder.phase = "optimizer"

    def action_starts(self, label: str, phase: str, roots: list[Any] | None = None) -> None:
        self.recorder.phase = phase
        self.user_part = phase
        if phase == "backward":
            self.accumulation.watch_graph(roots or [])
        self.actions.append([label, len(self.recorder.events), None])

    def action_ends(self) -> None:
        self.actions[-1][2] = len(self.recorder.events)
        if self.recorder.phase == "backward":
            self.accumulation.reset()
            _drop_unreached_grads(self.params, self.accumulation.reached)
        self.user_part = None


def _record(workload: Workload, step: Step) -> Trace:
    model, options, scaler, optimizer = step.model, step.options, step.scaler, step.optimizer
    names: dict[int, str] = {}
    for name, mod in model.named_modules(remove_duplicate=False):
        names.setdefault(id(mod), name)
    kinds = _known_storage_kinds(workload)
    if scaler is not None:
        # Persistent 0-dim device tensors, like a model's buffers (the memory pass keeps them
        # on the device for the whole step).
        for name, t in scaler.state_tensors().items():
            kinds.add(t.untyped_storage(), KIND_BUFFER, f"{GRAD_SCALER_MODULE}.{name}")
    modules = ModuleStack(names)
    accumulation = AccumulationWatch()
    recorder = OpRecorder(modules, kinds, accumulation)
    if scaler is not None:
        recorder.answer = scaler.finite.answer
    watch = _Watch(recorder, modules, accumulation, [p for p in model.parameters() if p.requires_grad])
    # the blocks torch.compile would compile: their calls are counted while the step runs
    fused_blocks = _fused_blocks(model, workload) if options.pointwise == "fused" else []
    try:
        assumed = None if options.real else Routing(options.moe_load, options.moe_capacity_factor)
        cuda_lists = options.amp is not None and options.autocast_device == "cuda"
        policy = watch.cuda_autocast = CudaAutocast() if cuda_lists else None
        labeler = GraphLabeler(modules, assumed)
        with (modules, labeler, recorder, collecting() as assumptions,
              sdpa_mode(options.sdpa, cpu_kernels=options.autocast_device == "cpu"), traced_loss.tracing(),
              policy.installed() if policy is not None else contextlib.nullcontext()):
            # an inference output stays alive until the recording stops, as it always did
            with _no_cyclic_collection(), calls_of_blocks(model, fused_blocks, modules):
                output = step.run(watch)
            watch.user_part = None
    except DATA_DEPENDENT as err:
        raise data_dependent_error(err, recorder, modules) from None
    except NnperfError:
        raise
    except Exception as err:
        part = watch.user_part
        if part is None or raised_by_nnperf(err, recorder):
            raise  # a bug of nnperf: keep the traceback
        raise model_failed_error(err, part, workload, recorder, modules, names, options) from None
    _classify_late_storages(recorder, model, optimizer)
    recorder.active = False
    del output
    module_types = {names[id(m)]: type(m).__name__ for m in model.modules()}
    fp8_linears = _fp8_linears(model, workload) if options.fp8 else []
    if fused_blocks:
        assumptions = [*assumptions, FUSED_ASSUMPTION.format(count=len(fused_blocks))]
    if fp8_linears:
        assumptions = [*assumptions, FP8_ASSUMPTION.format(count=len(fp8_linears))]
    module_params = {
        names[id(m)]: sum(local(p).numel() for p in m.parameters(recurse=False)) for m in model.modules()
    }
    param_storages = {
        recorder.storage_id(local(p), None): n for n, p in model.named_parameters()
    }
    trace = Trace(
        events=recorder.events,
        storages=recorder.storages,
        module_types=module_types,
        module_params=module_params,
        param_storages=param_storages,
        # every name of a tied parameter, so each owning module knows its weight shapes
        param_shapes={
            n: tuple(local(p).shape) for n, p in model.named_parameters(remove_duplicate=False)
        },
        module_output_bytes=dict(modules.output_bytes),
        mode="train" if options.train else "inference",
        config={
            "options": options.to_json(),
            "inputs": _input_descriptions(workload.inputs),
            "grad_scaler": scaler is not None,
            **({"assumptions": assumptions} if assumptions else {}),
            "loss_cross_entropy_calls": labeler.loss_cross_entropy_calls,
            # a pipeline schedule's actions: (label, first event, end event)
            **({"pipeline_actions": [tuple(a) for a in watch.actions]} if watch.actions else {}),
            **({"fp8_linears": fp8_linears} if fp8_linears else {}),
            # the blocks whose pointwise ops run fused (passes.fusion)
            **({"fused_blocks": fused_blocks} if fused_blocks else {}),
        },
    )
    fold_inplace_accumulations(trace, recorder.engine_sums)
    return trace


#: What a step with fused pointwise ops rests on (``passes.fusion``).
FUSED_ASSUMPTION = (
    "fused pointwise: in {count} repeated blocks, the pointwise, reduction and norm ops "
    "between two other kernels run as one kernel over the bytes entering and leaving them "
    "(torch.compile of each block; Transformer Engine's fused layers); for backward they keep what "
    "enters and leaves them, not what they compute inside (recomputed in backward: its transient "
    "is not counted); compiled (PyTorch's layers, not Transformer Engine's), a block's ops are "
    "issued as Inductor's wrapper issues them: each kernel one call from Python, no module call, "
    "autograd node or DTensor dispatch of its own, one autograd node for the block (Dynamo's guard "
    "check on each call not counted)"
)


#: What an FP8 step's figures rest on beyond the GEMMs and casts ``passes.timing`` times.
FP8_ASSUMPTION = (
    "FP8: {count} linear layers inside the repeated blocks run their GEMMs in FP8 with per-tensor current "
    "scaling (the 16-bit input and output gradient each scaled and cast first); their inputs are saved for "
    "backward as the engine saves them: in FP8 by Transformer Engine's linears in Megatron-LM's layouts (in "
    "16 bits where another op keeps the input anyway, as the attention's output projection does, cast again "
    "in backward: Transformer Engine 2.6 or later), in 16 bits by torchao's float8 (torchtitan's, and on one "
    "GPU); not counted: their weights' casts (once per step: Transformer Engine keeps the first "
    "micro-batch's) and the scale's all-reduce over tensor-parallel ranks; in Megatron-LM's layouts a mixture "
    "of experts' grouped GEMMs run in FP8 too (Transformer Engine's GroupedLinear), their inputs saved in FP8"
)


def _fp8_linears(model: torch.nn.Module, workload: Workload) -> list[str]:
    linears = linears_in_blocks(model)
    if not linears:
        raise UsageError(f"--fp8 converts the linear layers inside the repeated blocks of a model (two or more "
                         f"layers of one class in a ModuleList or Sequential: a transformer's), and {workload.name} "
                         "has none")
    return linears


def _fused_blocks(model: torch.nn.Module, workload: Workload) -> list[str]:
    blocks = block_names(model)
    if not blocks:
        raise UsageError(f"--pointwise fused fuses the pointwise ops inside the repeated blocks of a model (two or "
                         f"more layers of one class in a ModuleList or Sequential: a transformer's), and "
                         f"{workload.name} has none")
    return blocks


def _input_descriptions(inputs: tuple[Any, ...]) -> list[dict[str, Any]]:
    """Shapes and dtypes of the tensors the model was called with (after any --dtype cast)."""
    return [
        {"shape": list(t.shape), "dtype": dtype_name(t.dtype)}
        for t in inputs
        if isinstance(t, torch.Tensor)
    ]


@contextlib.contextmanager
def _no_cyclic_collection() -> Any:
    """Python's cyclic collector frees what reference cycles hold whenever allocation counts
    say so: a tensor kept by a cycle would be released at a different op from one trace to the
    next (a 64 KiB optimizer-phase peak moved with what the process had run before). Paused for
    the recorded step, such a tensor lives to its end, every time."""
    import gc

    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _known_storage_kinds(workload: Workload) -> KnownStorages:
    kinds = KnownStorages()
    for n, p in workload.model.named_parameters():
        kinds.add(local(p).untyped_storage(), KIND_PARAM, n)
    for n, b in workload.model.named_buffers():
        kinds.add(local(b).untyped_storage(), KIND_BUFFER, n)
    from torch.utils._pytree import tree_flatten

    for t in tree_flatten(workload.inputs)[0]:
        if isinstance(t, torch.Tensor):
            kinds.add(t.untyped_storage(), KIND_INPUT, keep_first=True)
    return kinds


def _drop_unreached_grads(params: list[torch.Tensor], reached: set[int]) -> None:
    """Parameters the loss never reaches (an unused head, a frozen branch's inputs) get no
    gradient in a real step, so no optimizer state either; the trace pre-allocated both
    (the warm-up step, ``grads_persist``) and drops them here. Only where the backward
    graph holds the parameters themselves: an engine's gradient flows through other
    tensors (FSDP2's unsharded copies of its DTensor shards)."""
    if not reached or not any(id(p) in reached for p in params):
        return
    for p in params:
        if local(p) is p and id(p) not in reached:
            p.grad = None


def _classify_late_storages(recorder: OpRecorder, model: torch.nn.Module, optimizer: Any) -> None:
    """Gradients and optimizer state are only recognizable once the step has run. State of
    a parameter without a gradient is not there in a real step (``_drop_unreached_grads``):
    PyTorch's optimizers create state only for parameters whose ``grad`` is set."""
    # a distributed optimizer's fp32 main gradients are gradients too (``gradient_params``), and
    # the 16-bit buckets beside them stand-ins it does not hold (``unheld_gradients``)
    held = [*model.parameters(), *(gradient_params(optimizer) if optimizer is not None else [])]
    unheld = {id(p) for p in unheld_gradients(optimizer)}
    for p in held:
        if p.grad is not None:
            kind = KIND_UNHELD_GRAD if id(p) in unheld else KIND_GRAD
            recorder.storages[recorder.storage_id(local(p.grad), None)].kind = kind
    if optimizer is not None:
        for param, state in optimizer_state(optimizer).items():
            if param.grad is None:
                continue
            for v in state.values():
                if isinstance(v, torch.Tensor):
                    recorder.storages[recorder.storage_id(local(v), None)].kind = KIND_OPT_STATE


def local(t: torch.Tensor) -> torch.Tensor:
    """The tensor one rank holds: a DTensor's local shard (FSDP2), else the tensor itself."""
    inner = getattr(t, "_local_tensor", None)
    return inner if isinstance(inner, torch.Tensor) else t


def cast_workload(workload: Workload, dtype: str | None) -> Workload:
    """The model and its floating inputs in ``dtype`` (``--dtype``); tensors already in it
    are kept (``trace.rebind``), so casting twice changes nothing."""
    if dtype is None:
        return workload
    target = DTYPES[dtype]
    rebind_tensors(workload.model, dtype=target)
    workload.inputs = tuple(
        t.to(target) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
        for t in workload.inputs
    )
    return workload


def _initialize_state(model: torch.nn.Module, optimizer: Any, scaler: TracedGradScaler | None) -> None:
    """Run one unrecorded step so the traced step is the steady state (state already exists,
    and a GradScaler's scale and growth tracker too)."""
    params = [p for p in model.parameters() if p.requires_grad]
    # a distributed optimizer's shares are parameters of their own (a GradScaler unscales them)
    for p in dict.fromkeys([*params, *gradient_params(optimizer)]):
        p.grad = torch.zeros_like(p)
    with skip_inplace_math():
        if scaler is None:
            optimizer.step()
        else:
            with scaler.finite:
                scaler.warm_up(optimizer, like=params[0])
    optimizer.zero_grad(set_to_none=True)  # a distributed optimizer's fp32 main gradients too
    for p in params:
        p.grad = None


def _allocate_grads(model: torch.nn.Module) -> None:
    """Give every trainable parameter a zero gradient, so backward accumulates into it."""
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
