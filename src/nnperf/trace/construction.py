"""Build a model inside the tracing context the way user code builds it.

Factories and model libraries do things to a model that fake tensors refuse:

- ``model.to(torch.bfloat16)``, ``model.cuda()``: ``Module._apply`` swaps a fake parameter in
  place (``torch.utils.swap_tensors``), which fails while the fake mode holds a weak reference
  to it ("_apply(): Couldn't swap Embedding.weight"). During the build the conversion rebinds
  each parameter and buffer to its converted copy instead, tied weights kept tied, as
  ``trace.rebind`` does for ``--dtype``.
- ``.to("cuda")``, ``device="cuda"``: the trace runs on the CPU's dispatch path (the target GPU
  is the prediction's business), and a CPU build of PyTorch cannot even make a fake CUDA
  tensor. During the build an accelerator device becomes the tensor's own device (``.to``,
  ``.cuda()``) or the CPU (tensor factories).
- ``torch.compile(model)``, ``model.compile()``: the trace records the eager ops the compiled
  module would run (``unwrap_compiled``); the caller says so.
- Python that reads tensor values while building (timm's ``[x.item() for x in
  torch.linspace(0, drop_path_rate, depth)]``, ``nn.init.trunc_normal_``'s rejection loop in
  torch 2.14): a fake tensor has no value (``DataDependentOutputException:
  aten._local_scalar_dense``). ``build_as_user_code`` then builds again outside the fake mode
  with every parameter registered on the meta device (as ``accelerate.init_empty_weights``
  does): the library's small helper tensors are real, its weights cost nothing and their
  initialization is skipped (a meta tensor has no storage); ``capture`` turns the meta
  parameters into fake CPU tensors.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from nnperf.trace import meta_world

T = TypeVar("T")

_ORIGINAL_APPLY = nn.Module._apply
_ORIGINAL_REGISTER_PARAMETER = nn.Module.register_parameter
_STATE = threading.local()


def current_fake_mode() -> Any:
    """The active ``FakeTensorMode``, or None (a ``--real`` trace)."""
    from torch._guards import detect_fake_mode

    return detect_fake_mode()


def build_as_user_code(build: Callable[[], T], *, meta_first: bool = False,
                       redirect_devices: bool = True) -> T:
    """``build()`` inside the tracing context, with the user-code conversions above working.

    Under a fake mode a build that reads a tensor's value is built again with its parameters
    on the meta device (``meta_first``: build that way at once, for libraries known to read
    values, timm and torchvision). A second failure propagates for the caller to explain
    (``reads_tensor_values``). ``redirect_devices=False`` for a library's own constructor,
    which moves nothing to an accelerator: the device check on every torch call is skipped.
    """
    if meta_first:  # known to read values while building, which meta tensors do not have
        meta_world.require_values("building the model")
    devices = _DevicesStayHere() if redirect_devices else contextlib.nullcontext()
    if current_fake_mode() is None:  # real or meta tensors: only devices need redirecting
        with devices:
            return build()
    if not meta_first:
        try:
            with devices, _rebinding_conversions():
                return build()
        except Exception as err:
            if not reads_tensor_values(err):
                raise
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    devices = _DevicesStayHere() if redirect_devices else contextlib.nullcontext()
    with unset_fake_temporarily(), _parameters_on_meta(), devices, _rebinding_conversions():
        return build()


def reads_tensor_values(err: BaseException) -> bool:
    """Whether ``err`` is fake tensors refusing to give a value (``.item()``, ``bool(t)``)."""
    from torch._subclasses.fake_tensor import DataDependentOutputException

    text = str(err)
    return (isinstance(err, DataDependentOutputException) or "_local_scalar_dense" in text
            or "cannot be called on meta tensors" in text)


def unwrap_compiled(model: nn.Module) -> tuple[nn.Module, bool]:
    """The eager module behind ``torch.compile(model)`` (and behind compiled submodules and
    ``model.compile()``), and whether any was compiled. The trace records eager ops: what
    a compiled step runs (fused kernels) is not what the trace holds."""
    if "torch._dynamo" not in sys.modules:  # nothing was compiled in this process
        return model, False
    from torch._dynamo.eval_frame import OptimizedModule

    compiled = False
    while isinstance(model, OptimizedModule):
        model, compiled = model._orig_mod, True
    for module in model.modules():
        for name, child in list(module._modules.items()):
            while isinstance(child, OptimizedModule):
                child, compiled = child._orig_mod, True
                module._modules[name] = child
        if getattr(module, "_compiled_call_impl", None) is not None:
            module._compiled_call_impl, compiled = None, True
    return model, compiled


def _rebinding_conversions() -> contextlib.AbstractContextManager[None]:
    """Module conversions rebind instead of swapping."""
    return _patched(nn.Module, "_apply", _rebinding_apply)


@contextlib.contextmanager
def _patched(owner: type, name: str, replacement: Any) -> Iterator[None]:
    original = owner.__dict__[name]
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        setattr(owner, name, original)


def _rebinding_apply(self: nn.Module, fn: Callable[[torch.Tensor], torch.Tensor],
                     recurse: bool = True) -> nn.Module:
    """``Module._apply`` that rebinds each parameter to ``Parameter(fn(p))`` (one copy per
    tensor, so tied weights stay tied across the whole call) and each buffer to ``fn(b)``.
    Children are converted through their own ``_apply`` (an ``nn.LSTM`` re-reads its flat
    weights there), which reaches this function again with the same memo."""
    top = getattr(_STATE, "memo", None) is None
    if top:
        _STATE.memo = {}
    memo: dict[int, torch.Tensor] = _STATE.memo
    try:
        if recurse:
            for child in self.children():
                child._apply(fn)
        for key, param in self._parameters.items():
            if param is None:
                continue
            if id(param) not in memo:
                with torch.no_grad():
                    applied = fn(param)
                if applied is param:
                    memo[id(param)] = param
                else:
                    new = nn.Parameter(applied, requires_grad=param.requires_grad)
                    if param.grad is not None:
                        with torch.no_grad():
                            new.grad = fn(param.grad)
                    memo[id(param)] = new
            self._parameters[key] = memo[id(param)]
        for key, buf in self._buffers.items():
            if buf is not None:
                if id(buf) not in memo:
                    memo[id(buf)] = fn(buf)
                self._buffers[key] = memo[id(buf)]
    finally:
        if top:
            _STATE.memo = None
    return self


class _DevicesStayHere(TorchFunctionMode):
    """``t.to("cuda")``/``t.cuda()`` keep ``t`` on its device; a factory asked for an
    accelerator (``torch.randn(..., device="cuda")``) makes its tensor on the CPU (the meta
    device in a meta recording, ``trace.meta_world``)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = dict(kwargs or {})
        if func in (torch.Tensor.cuda, torch.Tensor.xpu) and args:
            return args[0]
        if func is torch.Tensor.to and args:
            here = args[0].device
            args = (args[0], *(here if _accelerator(a) else a for a in args[1:]))
            if _accelerator(kwargs.get("device")):
                kwargs["device"] = here
        elif _accelerator(kwargs.get("device")):
            kwargs["device"] = meta_world.home_device()
        return func(*args, **kwargs)


def _accelerator(value: Any) -> bool:
    """A device (or its name or index) that is neither the CPU nor meta."""
    if isinstance(value, int) and not isinstance(value, bool):
        return True  # .to(0): CUDA device 0
    if isinstance(value, str):
        try:
            value = torch.device(value)
        except RuntimeError:
            return False
    return isinstance(value, torch.device) and value.type not in ("cpu", "meta")


@contextlib.contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """Every parameter a module registers goes to the meta device (its initialization,
    run on it afterwards, then does nothing); buffers stay real: they are small and models
    read them (rotary frequencies, position ids)."""

    def register(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and type(param) is nn.Parameter and not param.is_meta:
            param = nn.Parameter(param.detach().to("meta"), requires_grad=param.requires_grad)
        _ORIGINAL_REGISTER_PARAMETER(module, name, param)

    with _patched(nn.Module, "register_parameter", register):
        yield
