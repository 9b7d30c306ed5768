"""Recording a step on meta tensors: the same trace as on fake tensors, in half the time.

A fake tensor (``FakeTensorMode``) answers every op in Python: a cache key built from every
argument, then a meta kernel, then a new fake wrapped around its result. A meta tensor runs
the meta kernel straight from C++. The recorder's own work is the same on both, so a step
recorded on meta tensors costs what the recorder costs: a Llama-3.1-8B training step (bf16,
AdamW, 4096 tokens) is analyzed in 1.2-1.3 s on meta tensors and 2.9 s on fakes on a 2-core
x86 box (``benchmarks/hf_trace_speed.py``), with the same ops, FLOPs and bytes.

What fake tensors have and meta tensors lack, and how the meta world stands in for it:

- **A device.** Fakes pose as CPU tensors; factories under the fake mode make fakes. Here
  factories without a device make meta tensors (``_MetaFactories``), except the ones that
  take data (``torch.tensor``, ``as_tensor``, ``asarray``, with or without a device): they
  build a host tensor, as the fake mode does, and the ``lift_fresh`` that wraps it becomes a
  meta tensor (``call``), recorded as the host constant the fake trace records. A
  0-dim literal stays a real CPU scalar: it mixes with meta tensors and keeps its value, as a
  fake keeps a one-element literal's; moved to the model's device it stays where it is, as a
  CPU fake's ``.to("cpu")`` does.
- **Outputs the CPU kernel shapes.** A convolution's output memory format is the backend's
  choice (``_conv_determine_backend_memory_format``: channels-last in, channels-last out);
  the meta kernel, knowing no backend, returns contiguous tensors. Batch and layer norm's
  saved statistics differ too (``_CPU_SHAPED``). Those ops run on CPU fakes (``call``), as in
  the fake trace.
- **Autocast.** Autocast keys belong to a backend (``AutocastCPU``, ``AutocastCUDA``) and a meta
  tensor has none. With CUDA's op lists (``trace.autocast_cuda``: device-agnostic Python
  kernels on the ``AutocastCPU`` key) the key is added to the thread's dispatch set, so
  ``torch.autocast("cpu")`` casts meta tensors as it would cast CPU ones. A step that follows
  CPU's own lists (``autocast_device="cpu"``) keeps fake tensors: CPU's C++ kernels cast CPU
  tensors only.
- **Values.** Fakes keep constants: the MoE routing the trace assumes (``trace.routing``),
  grouped-GEMM offsets, host lengths of packed sequences, tensor literals. An op that needs one
  raises ``NeedsValues`` on meta tensors, and any other failure (``.item()``, a data-dependent
  shape, a CPU tensor met in the step) ends the meta attempt too: ``trace.capture`` then
  records the step on fakes, whose failure, if it fails again, is the one explained.

Answers kept (``call``): an op's output layout is a function of its inputs' shapes, strides
and dtypes and its other arguments, so the CPU-shaped ops' fake runs and the ATen meta kernels
written in Python (``torch._refs``: most pointwise ops) run once per distinct call; a
repeated call gets fresh meta tensors of the kept layouts. What could break that is left out:
ops that mutate or alias (including an alias the schema does not declare, checked on the
first run), seeded and data-dependent ops, other namespaces' ops, and calls with an argument
that is neither a meta tensor nor a plain value. The default dtype is part of the key.

Fused optimizers refuse meta parameters, and tensor-parallel and sharded ranks
(``trace.distributed``) are recorded on fakes: DTensor and the fake process group are
PyTorch's tested path there.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._device import _device_constructors
from torch.utils._pytree import tree_flatten, tree_map

from nnperf.trace.options import TraceOptions

META = torch.device("meta")
_STATE = threading.local()
#: Factories that take data: they build a host tensor, as in user code (see the docstring).
_DATA_FACTORIES = {torch.tensor, torch.as_tensor, torch.asarray}
_LIFTS = {torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default,
          torch.ops.aten.lift.default}
#: Ops whose CPU kernels shape their outputs otherwise than their meta kernels: a convolution's
#: memory format (the backend's choice: channels-last in, channels-last out; meta: contiguous),
#: batch norm's saved statistics in eval (empty on the CPU), layer norm's statistics of a
#: 16-bit input (16-bit on the CPU, fp32 on meta). Run on CPU fakes, as the fake trace runs them.
_CPU_SHAPED = {torch.ops.aten.convolution.default, torch.ops.aten.convolution_backward.default,
               torch.ops.aten._convolution.default, torch.ops.aten.native_batch_norm.default,
               torch.ops.aten.native_layer_norm.default}
_HANDLED = _LIFTS | _CPU_SHAPED


class NeedsValues(RuntimeError):
    """The step needs tensor values a meta trace does not have: record it on fakes."""


def eligible(options: TraceOptions) -> bool:
    """Whether a step with these options can be recorded on meta tensors: not with CPU
    autocast lists (see the docstring), nor with a fused optimizer (PyTorch's optimizers
    refuse ``fused=True`` for meta parameters)."""
    return (not options.real and options.optimizer_impl != "fused"
            and (options.amp is None or options.autocast_device == "cuda"))


def active() -> bool:
    """Whether a meta recording is running on this thread."""
    return getattr(_STATE, "on", False)


def home_device() -> torch.device:
    """Where a factory asked for an accelerator puts its tensor while a model is built."""
    return META if active() else torch.device("cpu")


def require_values(what: str) -> None:
    """Stop a meta recording at an op that needs values (fakes keep them)."""
    if active():
        raise NeedsValues(f"{what} needs tensor values")


@contextlib.contextmanager
def meta_world(options: TraceOptions) -> Iterator[None]:
    """Factories make meta tensors, and autocast casts them, for the duration."""
    autocast = (torch._C._IncludeDispatchKeyGuard(torch._C.DispatchKey.AutocastCPU)
                if options.amp is not None else contextlib.nullcontext())
    _STATE.on = True
    try:
        with _MetaFactories(), autocast:
            yield
    finally:
        _STATE.on, _STATE.fake_mode = False, None


def on_meta(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself on the meta device, else an empty meta tensor of its shape and layout
    (an input that requires grad still does, as its fake would)."""
    if t.is_meta:
        return t
    out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=META)
    return out.requires_grad_() if t.requires_grad and t.is_floating_point() else out


def handles(func: Any) -> bool:
    """Whether the recorder runs ``func`` through ``call`` (a meta recording's literals and
    CPU-shaped ops, and ops whose outputs are fresh tensors: see ``call``); every other op it
    runs itself, so a failing op's frame is its own (``trace.diagnosis``). This runs for every
    recorded op: a trace on fakes or real tensors stops at ``active``."""
    return active() and (func in _HANDLED or _fresh_outputs(func))


def call(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run an op that ``handles`` names as the fake trace has it (see the docstring). An op
    whose outputs are fresh tensors (no input mutated or aliased) answers from ``_LAYOUTS``
    where the same call was answered before: many meta kernels are Python decompositions
    (``torch._refs``: a pointwise op's broadcasting, type promotion and output strides, about
    a fifth of a millisecond each), and a network repeats its blocks' calls."""
    if func in _CPU_SHAPED:
        return _kept(func, args, kwargs, _run_on_cpu_fakes)
    if func not in _LIFTS:
        return _kept(func, args, kwargs, _run)
    out = func(*args, **kwargs)
    if not isinstance(out, torch.Tensor) or out.is_meta:
        return out
    return on_meta(out) if out.dim() > 0 else out.clone()  # a tensor of its own, as a fake


def _run(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return func(*args, **kwargs)


_FRESH: dict[Any, bool] = {}
#: Tags of ops whose outputs are not a function of their inputs' layouts and arguments.
_UNKEPT_TAGS = (torch.Tag.nondeterministic_seeded, torch.Tag.dynamic_output_shape,
                torch.Tag.data_dependent_output, torch.Tag.inplace_view)


def _fresh_outputs(func: Any) -> bool:
    """An ATen op that mutates and aliases nothing and returns tensors only (kept per op). Not
    another namespace's: nnperf's attention op lays its output out by the trace's mode."""
    fresh = _FRESH.get(func)
    if fresh is None:
        schema = getattr(func, "_schema", None)
        fresh = (schema is not None and func.namespace == "aten"  # others' kernels may read state of their own
                 and not schema.is_mutable and bool(schema.returns)
                 and all(r.alias_info is None and str(r.type) in ("Tensor", "Tensor[]") for r in schema.returns)
                 and not any(tag in func.tags for tag in _UNKEPT_TAGS))
        _FRESH[func] = fresh
    return fresh


def _kept(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], run: Any) -> Any:
    """``run``'s outputs for the call, on the meta device: computed once per distinct call
    (the inputs' shapes, strides and dtypes and the other arguments: what a kernel's output
    layout depends on), then fresh meta tensors of the kept layouts. For the CPU-shaped ops
    ``run`` is the fake run (~4 ms an op), for the rest the meta kernel itself."""
    key = _layout_key(func, args, kwargs)
    if key is None:
        return run(func, args, kwargs)
    layouts = _LAYOUTS.get(key)
    if layouts is None:
        out = run(func, args, kwargs)
        outputs = tree_flatten(out)[0]
        if not all(x is None or (isinstance(x, torch.Tensor) and x.is_meta) for x in outputs):
            return out  # a host scalar or an unexpected output: not kept
        if _aliases_an_input(outputs, args, kwargs):  # an alias its schema does not say
            _FRESH[func] = False  # (``_unsafe_view``): never kept
            return out
        layouts = tree_map(_layout_of, out)
        if len(_LAYOUTS) >= _LAYOUTS_KEPT:
            _LAYOUTS.clear()
        _LAYOUTS[key] = layouts
        return out
    return tree_map(_from_layout, layouts)


def _aliases_an_input(outputs: list[Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    from torch.multiprocessing.reductions import StorageWeakRef

    inputs = {StorageWeakRef(t.untyped_storage()) for t in tree_flatten((args, kwargs))[0]
              if isinstance(t, torch.Tensor)}
    return any(StorageWeakRef(t.untyped_storage()) in inputs for t in outputs if isinstance(t, torch.Tensor))


#: Output layouts of calls by their inputs' layouts and arguments (``_kept``); emptied when it
#: holds this many (a few MB), which bounds it without bookkeeping.
_LAYOUTS: dict[tuple[Any, ...], Any] = {}
_LAYOUTS_KEPT = 65536


class _Layout(tuple):
    """A meta tensor's shape, strides, dtype and whether it requires grad."""


def _layout_of(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return _Layout((tuple(x.shape), x.stride(), x.dtype, x.requires_grad))
    return x


def _from_layout(x: Any) -> Any:
    if isinstance(x, _Layout):
        shape, stride, dtype, requires_grad = x
        out = torch.empty_strided(shape, stride, dtype=dtype, device=META)
        return out.requires_grad_() if requires_grad else out
    return x


def _layout_key(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
    """The call's inputs as layouts and plain values, or None where an argument is neither a
    meta tensor nor a hashable plain value (such a call is not kept)."""
    parts: list[Any] = [func, torch.get_default_dtype()]  # a factory's dtype when none is given
    for x in (*args, *sorted(kwargs.items())):
        part = _key_part(x)
        if part is _UNKEPT:
            return None
        parts.append(part)
    return tuple(parts)


_UNKEPT = object()


def _key_part(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        if not x.is_meta:
            return _UNKEPT
        return ("tensor", tuple(x.shape), x.stride(), x.dtype, x.requires_grad)
    if isinstance(x, (list, tuple)):
        parts = tuple(_key_part(v) for v in x)
        return _UNKEPT if any(p is _UNKEPT for p in parts) else (type(x).__name__, parts)
    if x is None or isinstance(x, (bool, int, float, str, torch.dtype, torch.device, torch.memory_format,
                                   torch.layout)):
        return (type(x).__name__, x)
    return _UNKEPT


def _run_on_cpu_fakes(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    mode = getattr(_STATE, "fake_mode", None) or FakeTensorMode()
    _STATE.fake_mode = mode

    def to_fake(x: Any) -> Any:  # made under the mode: a fake, no host memory behind it
        if isinstance(x, torch.Tensor) and x.is_meta:
            return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="cpu")
        return x

    with mode:
        args, kwargs = tree_map(to_fake, args), tree_map(to_fake, kwargs)
        out = func(*args, **kwargs)
    return tree_map(lambda x: on_meta(x) if isinstance(x, FakeTensor) else x, out)


def _off_host(out: Any) -> Any:
    """A host literal on the meta device, but a scalar (0-dim) one as it is: a CPU scalar
    mixes with tensors of any device, and keeps its value, as a fake keeps a one-element
    literal's (``.item()`` on an optimizer's step counter)."""
    if isinstance(out, torch.Tensor) and out.dim() > 0 and not out.is_meta:
        return on_meta(out)
    return out


class _MetaFactories(TorchFunctionMode):
    """``torch.device("meta")`` as a default device, for the factories that take no data."""

    def __init__(self) -> None:
        super().__init__()
        self._factories = _device_constructors() - _DATA_FACTORIES

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = kwargs or {}
        if func in _DATA_FACTORIES:
            if _is_meta(kwargs.get("device")):
                kwargs = {k: v for k, v in kwargs.items() if k != "device"}
            out = func(*args, **kwargs)  # a host tensor, lifted (the recorder's ``call``)
            return _off_host(out)
        if func in self._factories and kwargs.get("device") is None:
            kwargs["device"] = META
        elif func is torch.Tensor.to and args and _host_scalar(args[0]):
            args, kwargs = _staying_on_host(args, kwargs)
        return func(*args, **kwargs)


def _host_scalar(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.dim() == 0 and t.device.type == "cpu"


def _staying_on_host(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple, dict]:
    """``scalar.to(device)`` for a host scalar literal and the meta device: the scalar stays
    where it is, as a CPU fake's ``.to("cpu")`` does (no op); a dtype given still converts."""
    kept: list[Any] = []
    for a in args[1:]:
        if isinstance(a, torch.Tensor):  # .to(other): other's dtype, not its device
            kept.append(a.dtype)
        elif not (isinstance(a, (str, torch.device)) and _is_meta(a)):
            kept.append(a)
    kwargs = {k: v for k, v in kwargs.items() if not (k == "device" and _is_meta(v))}
    return (args[0], *kept), kwargs


def _is_meta(device: Any) -> bool:
    return device is not None and torch.device(device).type == "meta"
