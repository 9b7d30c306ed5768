"""Records aten ops with their module, phase and storage lifetimes.

Three small mechanisms cooperate:
- ``ModuleStack`` follows module entry/exit with global forward hooks (forward attribution);
- ``GraphLabeler`` (a TorchFunctionMode) stamps each new autograd node with the module that
  created it, so backward ops can be attributed through ``_current_autograd_node``; it also
  routes ``scaled_dot_product_attention`` to the fused ``nnperf::attention`` op, the RNN
  functions to cuDNN's (``nnperf::cudnn_rnn``, ``trace.rnn``), and keeps the host values
  packed sequences need (``trace.packing``);
- ``OpRecorder`` (a TorchDispatchMode) writes one ``OpEvent`` per aten op and watches storages
  with ``weakref.finalize`` so the memory pass knows exactly when autograd frees them.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch._ops import HigherOrderOperator
from torch._subclasses.fake_tensor import FakeTensor
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import (
    TorchDispatchMode,
    _disable_current_modes,
    is_traceable_wrapper_subclass_type,
)
from torch.utils._pytree import tree_flatten, tree_map

from nnperf.trace import flex_attention as flex
from nnperf.trace import limits, meta_world, packing, routing
from nnperf.trace.accumulation import ADD, AccumulationWatch
from nnperf.trace.assumptions import assume
from nnperf.trace.attention import traced_sdpa
from nnperf.trace.events import KIND_ACTIVATION, OpEvent, StorageInfo, TensorMeta
from nnperf.trace.grad_scaler import LOCAL_SCALAR_DENSE
from nnperf.trace.loss import in_compiled_loss, traced_cross_entropy
from nnperf.trace.rnn import cudnn_rnn_call, is_rnn_function
from nnperf.trace.state_warmup import skipped_foreach

_LABEL_KEY = "nnperf.module"
_NODE_KEY = "nnperf.node"
_BLOCK_CALL_KEY = "nnperf.block_call"
_SKIPPED_NAMESPACES = {"prim", "profiler"}
#: Collectives write buffers their schemas do not annotate: never "free" views.
_COLLECTIVE_NAMESPACES = {"c10d", "_c10d_functional"}
#: Matrix products whose CPU and CUDA kernels refuse operands of different dtypes ("mat1 and
#: mat2 must have the same dtype"), which their meta kernels, and so fake tensors, accept: a bf16
#: Linear fed fp32 inputs would be predicted instead of failing as it does on the device.
_SAME_DTYPE = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
               torch.ops.aten.baddbmm.default, torch.ops.aten.addbmm.default, torch.ops.aten.mv.default,
               torch.ops.aten.addmv.default, torch.ops.aten.dot.default}


class OpRejected(RuntimeError):
    """An op the device's kernel refuses but the fake kernel would run (``_SAME_DTYPE``): raised
    by the recorder in the op's place, so the model's failure is reported like any op's."""


def _check_same_dtype(func: Any, args: tuple[Any, ...]) -> None:
    dtypes = list(dict.fromkeys(a.dtype for a in args if isinstance(a, torch.Tensor)))
    if len(dtypes) > 1:
        names = " and ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise OpRejected(f"the operands of {func._schema.name.split('::')[-1]} must have the same dtype "
                         f"(as the CPU and CUDA kernels require), but got {names}")


#: Ops that return their input itself for real but a new tensor on fake tensors (the schema
#: has no alias annotation): ``c10d::wait_tensor`` (torch/csrc/distributed/c10d/Functional.cpp)
#: waits on the collective's work and returns the tensor it was given, the buffer the
#: functional collective allocated. Recorded as the same storage, not a second allocation.
_RETURNS_INPUT = {torch.ops._c10d_functional.wait_tensor.default}
_SDPA = {F.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention}
#: Packed sequences on fake tensors (``trace.packing``): their shapes are host values.
_PACKING = {torch._pack_padded_sequence: packing.pack_padded, torch._pad_packed_sequence: packing.pad_packed}


#: How non-reentrant checkpointing stops a recomputation early (a private name of
#: torch.utils.checkpoint: an empty tuple, matching nothing, where a torch lacks it).
_StopRecomputation = getattr(torch.utils.checkpoint, "_StopRecomputationError", ())


class ModuleStack:
    """The module path currently executing, from global forward pre/post hooks."""

    def __init__(self, names: dict[int, str]):
        self._names = names
        self.stack: list[str] = [""]
        self.output_bytes: dict[str, int] = {}  # module path -> bytes of its forward outputs
        self._handles: list[Any] = []
        # module calls entered, and their own forward hooks, since the recorder last took them
        self.calls_pending = 0
        self.hooks_pending = 0
        # a torch function called from Python has not dispatched its first aten op yet
        self.python_call_pending = False
        # the fused block's call whose forward runs now (``OpEvent.block_call``), and the calls so far
        self.block_call = -1
        self._block_calls = 0

    def take_calls(self) -> tuple[int, int]:
        """(module calls, their hooks) since the last call: charged to the next recorded op."""
        taken = self.calls_pending, self.hooks_pending
        self.calls_pending = self.hooks_pending = 0
        return taken

    def current(self) -> str:
        return self.stack[-1]

    @contextlib.contextmanager
    def calling_block(self) -> Iterator[None]:
        """Count the ops run meanwhile as one more call of a fused block's forward."""
        outer, self.block_call = self.block_call, self._block_calls
        self._block_calls += 1
        try:
            yield
        finally:
            self.block_call = outer

    def push(self, path: str) -> None:
        self.stack.append(path)

    def pop(self) -> None:
        self.stack.pop()

    def _pre(self, module, args):
        self.calls_pending += 1
        self.hooks_pending += len(module._forward_hooks) + len(module._forward_pre_hooks)
        name = self._names.get(id(module))
        if name is None:  # a module outside the model, e.g. a loss module
            parent = self.current()
            name = f"{parent}.{type(module).__name__}" if parent else type(module).__name__
        self.stack.append(name)

    def _post(self, module, args, output):
        raised = sys.exc_info()[1]
        if raised is not None and not isinstance(raised, _StopRecomputation):
            return  # the failing module stays on the stack: the diagnosis names it (trace.diagnosis)
        if len(self.stack) > 1:
            name = self.stack.pop()
            produced = sum(
                t.numel() * t.element_size()
                for t in tree_flatten(output)[0]
                if isinstance(t, torch.Tensor)
            )
            self.output_bytes[name] = self.output_bytes.get(name, 0) + produced

    def __enter__(self) -> ModuleStack:
        hooks = torch.nn.modules.module
        self._handles = [
            hooks.register_module_forward_pre_hook(self._pre),
            # always_call: non-reentrant checkpointing stops a recomputation by raising once it
            # has the tensors backward needs, and the stopped forward leaves the stack too
            hooks.register_module_forward_hook(self._post, always_call=True),
        ]
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()


class GraphLabeler(TorchFunctionMode):
    """Stamps new autograd nodes with the creating module; swaps SDPA for the fused op (or
    the unfused kernels, ``trace.attention``), the RNN functions for cuDNN's and, in a compiled
    loss, cross entropy for its fused op (``trace.loss``)."""

    def __init__(self, modules: ModuleStack, assumed: routing.Routing | None = None):
        super().__init__()
        self._modules = modules
        self._routing = assumed  # MoE routing values to assume; None on real tensors
        self.loss_cross_entropy_calls = 0  # F.cross_entropy called by the loss function (advice: compile it)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self._modules.python_call_pending = True
        if func is F.cross_entropy and self._modules.current() == "(loss)":
            self.loss_cross_entropy_calls += 1
        if func in _SDPA:
            out = traced_sdpa(*args, **kwargs)
        elif func is F.multi_head_attention_forward:
            with _functional_calls_traced():
                out = func(*args, **kwargs)
        elif func is F.dropout:
            out = _native_dropout(func, args, kwargs)
        elif func is F.cross_entropy and in_compiled_loss():
            out = traced_cross_entropy(*args, **kwargs)
        elif is_rnn_function(func):
            out = cudnn_rnn_call(func, args, kwargs)
            if out is NotImplemented:
                out = func(*args, **kwargs)
        elif func in _PACKING:
            meta_world.require_values("a packed sequence (its lengths)")
            out = _PACKING[func](*args, **kwargs) if isinstance(args[0], FakeTensor) else NotImplemented
            if out is NotImplemented:
                out = func(*args, **kwargs)
        elif packing.folds(func) and (out := packing.fold(func, args, kwargs)) is not NotImplemented:
            pass
        elif routing.is_topk(func) and self._routing is not None:
            meta_world.require_values("top-k routing (the trace assumes its indices)")
            out = routing.routed_topk(func, args, kwargs, self._routing)
        elif self._routing is not None and routing.constant_args(args, kwargs) and not _is_collective(func):
            out = routing.shadowed(func, args, kwargs)
        else:
            out = func(*args, **kwargs)
        if torch.is_grad_enabled():
            self.label(out)
        return out

    def label(self, out: Any) -> None:
        """Stamp the autograd nodes behind ``out`` not stamped yet with the module running now,
        and with the fused block's call running it (a gradient's accumulation into ``.grad``
        stays outside the block: the engine runs it, not the block's backward)."""
        path, call = self._modules.current(), self._modules.block_call
        flat, _ = tree_flatten(out)
        pending = [t.grad_fn for t in flat if isinstance(t, torch.Tensor) and t.grad_fn is not None]
        while pending:
            node = pending.pop()
            meta = node.metadata
            if _LABEL_KEY in meta:
                continue
            meta[_LABEL_KEY] = path
            if call >= 0 and type(node).__name__ != "AccumulateGrad":
                meta[_BLOCK_CALL_KEY] = call
            pending.extend(nxt for nxt, _ in node.next_functions if nxt is not None)


def label_nodes(out: Any) -> None:
    """Stamp the autograd nodes behind ``out`` with the module running now, where a trace runs:
    for the output of a custom ``autograd.Function``, whose ``apply`` the function mode does not
    see (its backward's ops would be attributed to whichever module next used the output)."""
    from torch.overrides import _get_current_function_mode_stack

    for mode in _get_current_function_mode_stack():
        if isinstance(mode, GraphLabeler):
            mode.label(out)


@contextlib.contextmanager
def _functional_calls_traced() -> Iterator[None]:
    """``F.multi_head_attention_forward`` (``nn.MultiheadAttention``, and so
    ``nn.TransformerEncoderLayer`` and ``nn.Transformer``) calls SDPA and dropout through
    ``torch.nn.functional``'s own globals while this mode is set aside for its handler, so
    neither call would reach ``GraphLabeler``: the CPU's math attention (fp32 under bf16
    autocast, the score matrix in memory) and CPU dropout would be traced where a GPU runs one
    fused SDPA kernel and ``native_dropout``. For the call, those globals are the traced ones.

    The GPU's choice, from ``torch/nn/modules/activation.py`` and ``F.multi_head_attention_forward``:
    ``need_weights=False`` (what ``TransformerEncoderLayer`` passes) runs SDPA, fused on a GPU
    (also inside the inference fast path, ``_native_multi_head_attention``, which calls
    ``at::scaled_dot_product_attention`` when flash or memory-efficient attention serves);
    ``need_weights=True`` (``MultiheadAttention``'s default) computes the score matrix with
    ``bmm``, ``softmax`` and ``bmm``, traced as written. The fast path's fused bias, residual
    and norm kernels (inference without autocast only) are not modelled: its GEMMs and
    attention are these."""
    saved = F.scaled_dot_product_attention, F.dropout
    original_dropout = F.dropout
    F.scaled_dot_product_attention = traced_sdpa
    F.dropout = lambda *args, **kwargs: _native_dropout(original_dropout, args, kwargs)
    try:
        yield
    finally:
        F.scaled_dot_product_attention, F.dropout = saved


def _native_dropout(func, args, kwargs):
    """Training dropout as the one fused kernel CUDA runs (``native_dropout``); on CPU
    PyTorch would decompose it into bernoulli_, div_ and mul, a different cost."""
    names = ("input", "p", "training", "inplace")
    bound = dict(zip(names, args, strict=False)) | kwargs
    x, p, training = bound["input"], bound.get("p", 0.5), bound.get("training", True)
    if not training or p == 0.0 or not isinstance(x, torch.Tensor) or not x.is_floating_point():
        return func(*args, **kwargs)
    return torch.ops.aten.native_dropout(x, float(p), True)[0]


class KnownStorages:
    """The storages whose kind is known before the step runs (parameters, buffers, inputs).

    Looked up by object identity, not by ``id`` alone: a storage that dies during the step (a
    pipeline stage's input, once split into micro-batches) frees its ``id`` for a storage the
    step creates later, which must not inherit its kind. Keyed by ``id`` only, an activation
    that happened to land at a dead input's address was counted as an input, and a memory
    prediction moved by 64 KiB with where Python placed its objects."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[weakref.ref[Any], str, str | None]] = {}

    def add(self, storage: Any, kind: str, name: str | None = None, *, keep_first: bool = False) -> None:
        """Note ``storage``'s kind (``keep_first``: unless it is already noted)."""
        if keep_first and self.kind_of(storage) is not None:
            return
        self._by_id[id(storage)] = (weakref.ref(storage), kind, name)

    def kind_of(self, storage: Any) -> tuple[str, str | None] | None:
        """``storage``'s noted kind and name, or None."""
        known = self._by_id.get(id(storage))
        if known is None or known[0]() is not storage:
            return None
        return known[1], known[2]


class OpRecorder(TorchDispatchMode):
    """Writes one OpEvent per aten op; tracks storages from creation to release."""

    def __init__(
        self,
        modules: ModuleStack,
        storage_kinds: KnownStorages,
        accumulation: AccumulationWatch | None = None,
    ):
        super().__init__()
        self._modules = modules
        self._accumulation = accumulation
        self.engine_sums: set[int] = set()  # events where autograd adds gradients (in place for real)
        self._known_kinds = storage_kinds  # params, buffers, inputs
        self.events: list[OpEvent] = []
        self._max_ops = limits.max_traced_ops()  # this machine's bound on one trace
        self.storages: dict[int, StorageInfo] = {}
        self._sid_of: dict[int, int] = {}  # id(storage object) -> storage id, while alive
        self._holders: dict[int, int] = {}  # storage id -> live storage objects that are it
        self.phase = "forward"
        self.active = True
        self.current_func: Any = None
        # Decides ops the fake device cannot run (the GradScaler's found-inf ``.item()``):
        # returns the op's value, or None to run it. The op is recorded either way.
        self.answer: Callable[[Any], Any] | None = None
        self._pending_allocations: list[int] = []
        # DTensor dispatches (and the tensors of their list arguments beyond the first) since
        # the last recorded op: the host work they add is charged to the next op
        self._subclass_dispatches = 0
        self._subclass_list_tensors = 0
        self._nodes_seen = 0  # backward nodes numbered so far (``backward_node``)

    # -- storages -------------------------------------------------------------------------
    def storage_id(self, t: torch.Tensor, creating_event: int | None) -> int:
        st = t.untyped_storage()
        key = id(st)
        sid = self._sid_of.get(key)
        if sid is None:
            sid = len(self.storages)
            self._sid_of[key] = sid
            kind, name = self._known_kinds.kind_of(st) or (KIND_ACTIVATION, None)
            self.storages[sid] = StorageInfo(
                nbytes=st.nbytes(), kind=kind, created_by=creating_event, name=name
            )
            self._watch(st, sid)
        return sid

    def _watch(self, st: Any, sid: int) -> None:
        self._sid_of[id(st)] = sid
        self._holders[sid] = self._holders.get(sid, 0) + 1
        weakref.finalize(st, self._released, id(st), sid)

    def _alias(self, out: torch.Tensor, of: torch.Tensor) -> None:
        """Record ``out``'s storage object as ``of``'s storage (``_RETURNS_INPUT``): one
        allocation, released when the last of the two objects is."""
        st = out.untyped_storage()
        if id(st) not in self._sid_of:
            self._watch(st, self.storage_id(of, None))

    def _released(self, key: int, sid: int) -> None:
        if self._sid_of.get(key) == sid:
            del self._sid_of[key]
        self._holders[sid] -= 1
        if self._holders[sid]:
            return  # another storage object is the same allocation (``_alias``)
        del self._holders[sid]
        if not self.active:
            return
        info = self.storages[sid]
        if info.released_after is not None:  # freed earlier by a resize (storage_freed)
            return
        last = len(self.events) - 1
        info.released_after = last
        if last >= 0:
            self.events[last].releases.append(sid)

    def storage_freed(self, t: torch.Tensor) -> None:
        """An engine resized ``t``'s storage to 0 bytes (FSDP2's ``free_storage`` after it
        reshards a gathered parameter): the allocation ends after the last recorded op."""
        sid = self._sid_of.pop(id(t.untyped_storage()), None)
        if sid is None or not self.active:
            return
        last = len(self.events) - 1
        self.storages[sid].released_after = last
        if last >= 0:
            self.events[last].releases.append(sid)

    def storage_allocated(self, t: torch.Tensor) -> None:
        """An engine resized ``t``'s storage back to its size (FSDP2's ``alloc_storage`` before
        it gathers a parameter): a new allocation, counted from the next recorded op."""
        self._sid_of.pop(id(t.untyped_storage()), None)
        if self.active:
            self._pending_allocations.append(self.storage_id(t, len(self.events)))

    def meta(self, t: torch.Tensor, creating_event: int | None) -> TensorMeta:
        return TensorMeta(
            storage=self.storage_id(t, creating_event),
            shape=tuple(map(int, t.shape)),
            dtype=t.dtype,
            stride=tuple(map(int, t.stride())),
            storage_offset=int(t.storage_offset()),
        )

    def _metas_in(self, args: Any, kwargs: dict[str, Any]) -> tuple[Any, Any, list[TensorMeta]]:
        """``args`` and ``kwargs`` with tensors replaced by TensorMeta, and those metas in
        ``tree_flatten`` order: one pass over plain containers (what aten arguments are),
        ``tree_map`` for anything else. A trace is tens of thousands of ops, so this path
        is kept lean; both ways give the same result."""
        found: list[TensorMeta] = []
        to_meta = self.meta
        try:
            return (_map_plain(args, to_meta, found), _map_plain(kwargs, to_meta, found), found)
        except _NotPlain:
            def to_meta_in(x: Any) -> Any:
                if isinstance(x, torch.Tensor):
                    return to_meta(x, None)
                return _trace_device(x) if isinstance(x, torch.device) else x
            meta_args = tree_map(to_meta_in, args)
            meta_kwargs = tree_map(to_meta_in, kwargs)
            inputs = [x for x in tree_flatten((meta_args, meta_kwargs))[0]
                      if isinstance(x, TensorMeta)]
            return meta_args, meta_kwargs, inputs

    # -- ops ------------------------------------------------------------------------------
    def module_path(self) -> str:
        if self.phase == "backward":
            node = torch._C._current_autograd_node()
            if node is not None:
                return node.metadata.get(_LABEL_KEY, "")
        if self.phase == "optimizer":
            # a pseudo-module pushed around optimizer-phase work (the GradScaler's update)
            return self._modules.current() or "(optimizer)"
        return self._modules.current()

    def backward_node(self) -> int:
        """The number of the backward node running now (-1 outside one): nodes are numbered
        in the order they first run an op, so ops of one node share it."""
        if self.phase != "backward":
            return -1
        node = torch._C._current_autograd_node()
        if node is None:
            return -1
        meta = node.metadata  # numbered in the node itself: the trace holds no node alive
        number = meta.get(_NODE_KEY)
        if number is None:
            number = meta[_NODE_KEY] = self._nodes_seen
            self._nodes_seen += 1
        return number

    def block_call(self) -> int:
        """The fused block's call running the op (``OpEvent.block_call``): in backward, the one
        whose forward made the running node; none inside an engine's hooks around a block
        (``outside_block_calls``)."""
        if _OUTSIDE_BLOCK_CALLS.depth:
            return -1
        if self.phase != "backward":
            return self._modules.block_call
        node = torch._C._current_autograd_node()
        return -1 if node is None else node.metadata.get(_BLOCK_CALL_KEY, -1)

    def enter_module(self, path: str) -> None:
        """Count what runs next as ``path``'s forward, until ``leave_module``
        (``recomputing_module``)."""
        self._modules.push(path)

    def leave_module(self) -> None:
        self._modules.pop()

    def recomputing(self) -> bool:
        """A module's forward running inside backward: activation checkpointing recomputing
        a block (backward's own ops run outside every module's forward). The pseudo-modules
        the loop's own work is recorded under in the backward phase, "(clip_grad_norm)" and
        "(grad_scaler)", run no forward again."""
        return self.phase == "backward" and any(not path.startswith("(") for path in self._modules.stack[1:])

    #: FlexAttention's higher-order ops come here too (``trace.flex_attention``).
    supports_higher_order_operators = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(is_traceable_wrapper_subclass_type(t) for t in types):
            # A DTensor (FSDP2's sharded parameters): let it dispatch, then record the ops it
            # runs on its local shard, the kernels one rank runs (trace.distributed); the host
            # time of the dispatch itself goes to the next recorded op.
            if not _UNRECORDED.depth:
                self._subclass_dispatches += 1
                self._subclass_list_tensors += _list_tensors_beyond_first(args)
            return NotImplemented
        if isinstance(func, HigherOrderOperator):
            return self._higher_order(func, args, kwargs)
        if func.namespace in _SKIPPED_NAMESPACES or _UNRECORDED.depth:
            return func(*args, **kwargs)
        self.current_func = func
        index = len(self.events)
        if index >= self._max_ops:
            raise limits.too_many_ops(self._max_ops)
        meta_args, meta_kwargs, inputs = self._metas_in(args, kwargs)
        first_new = len(self.storages)
        if func in _SAME_DTYPE:
            _check_same_dtype(func, args)
        out = self.answer(func) if self.answer is not None and func is LOCAL_SCALAR_DENSE else None
        if out is None and skipped_foreach(func, args, kwargs):
            out = args[0] if func._schema.returns else None
        elif out is None and meta_world.handles(func):
            out = meta_world.call(func, args, kwargs)
        elif out is None:
            out = func(*args, **kwargs)
        if func in _RETURNS_INPUT:
            self._alias(out, args[0])
        outputs = [self.meta(t, index) for t in _output_tensors(out)]
        allocates = [m.storage for m in outputs if m.storage >= first_new]
        # An op is a free view by what it does itself: storages an engine re-allocated just
        # before it (FSDP2's resize before copying gathered parameters out) start their lives
        # here, but a view recorded next still launches no kernel.
        writes = func._schema.is_mutable or func._schema.name in _COPIES_INTO_ARGUMENT
        free = not allocates and not writes and func.namespace not in _COLLECTIVE_NAMESPACES and (
            bool(outputs) or func._schema.name in _METADATA_OPS
            or (func is LOCAL_SCALAR_DENSE and _host_value(args[0]))
        )
        if self._pending_allocations:  # storages an engine re-allocated just before this op
            allocates += self._pending_allocations
            self._pending_allocations = []
        module_calls, module_hooks = self._modules.take_calls()
        python_call, self._modules.python_call_pending = self._modules.python_call_pending, False
        self.events.append(
            OpEvent(
                index=index,
                func=func,
                args=meta_args,
                kwargs=meta_kwargs,
                inputs=inputs,
                outputs=outputs,
                phase=self.phase,
                module=self.module_path(),
                free=free,
                allocates=list(dict.fromkeys(allocates)),
                recomputed=self.recomputing(),
                subclass_dispatches=self._subclass_dispatches,
                subclass_list_tensors=self._subclass_list_tensors,
                records_grad=self.phase != "backward" and _records_grad(args, kwargs),
                module_calls=module_calls,
                module_hooks=module_hooks,
                backward_node=self.backward_node(),
                python_call=python_call,
                block_call=self.block_call(),
            )
        )
        self._subclass_dispatches = self._subclass_list_tensors = 0
        if func in _KEEP_VALUES:
            self.events[-1].values = _kept_values(func, args, kwargs)
        acc = self._accumulation
        if func is ADD and acc is not None and self.phase == "backward" and acc.may_sum_in_place(func, args):
            self.engine_sums.add(index)
        self.current_func = None
        return out

    def _higher_order(self, func: HigherOrderOperator, args: tuple, kwargs: dict[str, Any]) -> Any:
        """FlexAttention's forward or backward kernel, recorded as one op with the attention
        tensors, the scale and the pairs its block mask keeps and computes
        (``trace.flex_attention``); any other higher-order op is not traced."""
        if func not in flex.HIGHER_ORDER_OPS:
            raise NotImplementedError(
                f"nnperf does not trace the higher-order op {func.name()!r} (of those, only "
                "FlexAttention's); call the model's plain PyTorch code instead")
        index = len(self.events)
        main, block_mask, read = flex.hop_call_parts(func, args)
        inputs = [self.meta(t, None) for t in read]
        metas = dict(zip(map(id, read), inputs, strict=True))
        meta_args = tuple(metas[id(a)] if isinstance(a, torch.Tensor) else a for a in main)
        pairs = flex.mask_pairs(block_mask, args[0], args[1], assume)
        first_new = len(self.storages)
        out = func(*args, **kwargs)
        outputs = [self.meta(t, index) for t in _output_tensors(out)]
        allocates = [m.storage for m in outputs if m.storage >= first_new] + self._pending_allocations
        self._pending_allocations = []
        self.events.append(OpEvent(
            index=index, func=func, args=meta_args, kwargs={}, inputs=inputs, outputs=outputs,
            phase=self.phase, module=self.module_path(), allocates=list(dict.fromkeys(allocates)),
            recomputed=self.recomputing(), subclass_dispatches=self._subclass_dispatches,
            subclass_list_tensors=self._subclass_list_tensors,
            values={"kept_pairs": (pairs.kept,), "executed_pairs": (pairs.executed,)},
            block_call=self.block_call(),
        ))
        self._subclass_dispatches = self._subclass_list_tensors = 0
        return out


def _records_grad(args: tuple, kwargs: dict[str, Any]) -> bool:
    """Whether autograd records a node for the op being dispatched: grad mode is on and an
    input requires grad (what ``VariableType`` checks before it makes the node)."""
    if not torch.is_grad_enabled():
        return False
    for a in args:
        if isinstance(a, torch.Tensor):
            if a.requires_grad:
                return True
        elif isinstance(a, (list, tuple)) and any(isinstance(t, torch.Tensor) and t.requires_grad for t in a):
            return True
    return any(isinstance(v, torch.Tensor) and v.requires_grad for v in kwargs.values())


def _list_tensors_beyond_first(args: tuple) -> int:
    """Tensors of an op's list arguments after the first of each list (a foreach op's)."""
    return sum(len(a) - 1 for a in args
               if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor))


#: Ops whose cost depends on an argument's values: the grouped GEMM's group offsets.
_KEEP_VALUES = {torch.ops.aten._grouped_mm.default}
GROUPS_UNKNOWN = ("grouped GEMM: group sizes (offsets) unknown to the fake trace; rows are "
                  "assumed split evenly over the groups")


def _kept_values(func: Any, args: tuple, kwargs: dict) -> dict[str, tuple[int, ...]] | None:
    """The values of ``offs`` where the trace knows them (a real tensor, a constant fake);
    else the formulas split the rows evenly, which the trace states as an assumption."""
    offs = args[2] if len(args) > 2 else kwargs.get("offs")
    if offs is None:
        return None
    if offs.device.type == "meta":  # a meta recording (a fake says "cpu")
        meta_world.require_values("a grouped GEMM's group offsets")
    if isinstance(offs, FakeTensor):
        if offs.constant is None:
            assume(GROUPS_UNKNOWN)
            return None
        offs = offs.constant
    with _disable_current_modes():  # a real tensor: read it without the fake mode
        return {"offs": tuple(int(v) for v in offs.tolist())}


def _host_value(t: Any) -> bool:
    """A value the trace keeps on the host (``trace.packing``'s lengths): reading it is no
    device synchronization, as reading a CPU tensor is not."""
    return packing.is_host(t)


#: Nesting depth of ``unrecorded()``: ops run meanwhile are an engine's bookkeeping.
class _Nesting:
    """How deeply a module-wide mode is entered, read by the dispatch modes on every op: a
    context manager raises it while it runs (nested uses count)."""

    def __init__(self) -> None:
        self.depth = 0

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1


_UNRECORDED = _Nesting()


@contextlib.contextmanager
def calls_of_blocks(model: torch.nn.Module, blocks: list[str], modules: ModuleStack) -> Iterator[None]:
    """While it runs, each call of the forward of a block named in ``blocks`` (``model``'s fused
    blocks) counts its ops as that call's (``ModuleStack.calling_block``): what torch.compile
    compiles when torchtitan compiles each block, the forward itself; the hooks around it
    (FSDP2's gathers and reductions) run outside, eagerly."""
    wrapped: list[tuple[torch.nn.Module, Any]] = []
    try:
        for name in blocks:
            block = model.get_submodule(name)
            own = block.__dict__.get("forward")  # a forward set on the instance (checkpointing's)
            block.forward = _counted(block.forward, modules)
            wrapped.append((block, own))
        yield
    finally:
        for block, own in wrapped:
            if own is None:
                del block.forward
            else:
                block.forward = own


def _counted(forward: Callable[..., Any], modules: ModuleStack) -> Callable[..., Any]:
    @functools.wraps(forward)
    def call(*args: Any, **kwargs: Any) -> Any:
        with modules.calling_block():
            return forward(*args, **kwargs)
    return call


_OUTSIDE_BLOCK_CALLS = _Nesting()


def outside_block_calls() -> contextlib.AbstractContextManager[None]:
    """Count the ops run meanwhile as no fused block's call (``OpEvent.block_call``) wherever
    they run: an engine's hooks around a block (FSDP2's unshard before the block's backward and
    reduction after it) that run inside the autograd nodes of the block's own graph."""
    return _OUTSIDE_BLOCK_CALLS.entered()


@contextlib.contextmanager
def recomputing_module(path: str) -> Iterator[None]:
    """Run a checkpointed module's recomputation as ``path``'s forward on the active trace's
    module stack. torch.utils.checkpoint calls the module's wrapped forward, not the module, so
    no forward hook enters it in backward: without this, the module's own ops (a residual add,
    an inline norm) would not count as recomputed (``OpRecorder.recomputing``), only those of
    its submodules. Nothing outside a trace."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    recorders = [m for m in _get_current_dispatch_mode_stack() if isinstance(m, OpRecorder)]
    if not recorders:
        yield
        return
    recorder = recorders[-1]
    recorder.enter_module(path)
    try:
        yield
    finally:
        recorder.leave_module()


def _is_collective(func: Any) -> bool:
    """A collective's values on a fake process group are none a trace could use (expert
    parallelism sets its received counts itself: ``trace.parallel.expert``), so it is not run on
    constants' values too."""
    return str(getattr(func, "_qualified_op_name", None) or func).startswith(("_c10d_functional", "c10d"))


def unrecorded() -> contextlib.AbstractContextManager[None]:
    """Run ops without recording them: bookkeeping an engine does on placeholder tensors
    that no GPU runs (DTensor's sharding propagation builds fake arguments to learn output
    shapes)."""
    return _UNRECORDED.entered()


_METADATA_OPS = {"aten::sym_size", "aten::sym_stride", "aten::sym_numel", "aten::is_same_size"}
#: Ops whose schema declares no write, whose meta kernel returns views of an argument, and whose
#: device kernel copies into that argument: FSDP2's ``all_gather_copy_in`` (its CUDA kernel runs
#: ``_foreach_copy_`` from the shards into the rank's slice of the all-gather buffer it was given).
_COPIES_INTO_ARGUMENT = {"fsdp::all_gather_copy_in"}
#: Argument values that are leaves for ``tree_map`` (anything else unknown takes its path).
_PLAIN_LEAVES = frozenset({
    int, float, bool, complex, str, type(None),
    torch.dtype, torch.device, torch.layout, torch.memory_format,
})


class _NotPlain(Exception):
    """An argument the plain-container fast path does not handle (``torch.Size``, ...)."""


def _map_plain(x: Any, fn: Callable[[torch.Tensor, None], TensorMeta], found: list[TensorMeta]) -> Any:
    """``tree_map`` of ``fn`` over tensors in tuples, lists and dicts; appends each result to
    ``found`` in ``tree_flatten`` order. Raises ``_NotPlain`` for any other container."""
    if isinstance(x, torch.Tensor):
        m = fn(x, None)
        found.append(m)
        return m
    kind = type(x)
    if kind is torch.device:
        return _trace_device(x)
    if kind in _PLAIN_LEAVES:
        return x
    if kind is tuple:
        return tuple([_map_plain(v, fn, found) for v in x])
    if kind is list:
        return [_map_plain(v, fn, found) for v in x]
    if kind is dict:
        return {k: _map_plain(v, fn, found) for k, v in x.items()}
    raise _NotPlain


def _trace_device(device: torch.device) -> torch.device:
    """The CPU, the device a trace's ops run on, for the meta device of a meta recording
    (``trace.meta_world``): the recorded step is the one recorded on CPU fakes."""
    return _CPU if device.type == "meta" else device


_CPU = torch.device("cpu")


def _output_tensors(out: Any) -> list[torch.Tensor]:
    """The tensors of an op's result in ``tree_flatten`` order (a tensor, or a tuple or list
    of them in the common case)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if type(out) in (tuple, list) and all(isinstance(t, torch.Tensor) for t in out):
        return list(out)
    return [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
