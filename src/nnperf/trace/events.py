"""The trace: one record per aten op of a forward pass or a whole training step.

Every later pass (counting, GEMM lowering, time prediction, memory) reads only these
records, so they carry everything those passes need: shapes, dtypes, strides, the
phase and module that issued the op, and storage identities for tensor lifetimes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch._ops import HigherOrderOperator

from nnperf.vocab import Phase, StorageKind

PHASES = tuple(Phase)

# The names the trace's users import; aliases of the enum members (see ``nnperf.vocab``).
KIND_PARAM = StorageKind.PARAMETER
KIND_BUFFER = StorageKind.BUFFER
KIND_INPUT = StorageKind.INPUT
KIND_GRAD = StorageKind.GRADIENT
KIND_UNHELD_GRAD = StorageKind.UNHELD_GRADIENT
KIND_OPT_STATE = StorageKind.OPTIMIZER_STATE
KIND_ACTIVATION = StorageKind.ACTIVATION


@dataclass(frozen=True, slots=True)
class TensorMeta:
    """A tensor as an op saw it. ``storage`` identifies the memory it lives in."""

    storage: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    stride: tuple[int, ...]
    storage_offset: int = 0

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        """Bytes of the elements this view covers (what a kernel touching it must move)."""
        return self.numel * self.dtype.itemsize

    def to_json(self) -> dict[str, Any]:
        return {
            "storage": self.storage,
            "shape": list(self.shape),
            "dtype": dtype_name(self.dtype),
            "stride": list(self.stride),
        }


@dataclass(slots=True)
class OpEvent:
    """One aten op. ``args``/``kwargs`` are the op's arguments with tensors replaced by TensorMeta."""

    index: int
    func: Any  # torch._ops.OpOverload; kept so passes can look formulas up by identity
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    inputs: list[TensorMeta]
    outputs: list[TensorMeta]
    phase: str  # a ``Phase`` value
    module: str
    free: bool = False  # a view, alias or metadata op: no kernel, no memory traffic
    allocates: list[int] = field(default_factory=list)  # storages created by this op
    releases: list[int] = field(default_factory=list)  # storages that died right after it
    # Argument values the cost formulas need and the trace knows (a grouped GEMM's offsets,
    # from assumed routing: ``trace.routing``), by argument name; None: none kept.
    values: dict[str, tuple[int, ...]] | None = None
    # A forward op run again in backward by activation checkpointing: hardware FLOPs, not the
    # model's (MFU leaves it out).
    recomputed: bool = False
    # DTensor (tensor-subclass) dispatches that led to this op since the previous one, and the
    # tensors of their list arguments beyond the first: host time the time model adds
    subclass_dispatches: int = 0
    subclass_list_tensors: int = 0
    # What the host does around the op in an eager step (``passes.host_time`` prices each):
    # a forward op that records an autograd node (grad mode on, an input requiring grad);
    # ``nn.Module`` calls entered since the previous op, and the forward hooks of their own
    # those calls ran (not nnperf's); the backward node running the op (a number unique in
    # the step; -1 outside backward); the first op of a call made from Python (the others of
    # that call, an autograd node's and autocast's casts are dispatched from C++).
    records_grad: bool = False
    python_call: bool = False
    module_calls: int = 0
    module_hooks: int = 0
    backward_node: int = -1
    # The call of a fused block (``config["fused_blocks"]``: a block torch.compile compiles)
    # whose forward ran the op, or whose forward made the backward node running it: numbered
    # in the order the calls began; -1 outside (a hook around the block, FSDP2's, runs eagerly)
    block_call: int = -1

    @property
    def name(self) -> str:
        """Short op name, e.g. ``aten.mm`` (overload dropped)."""
        return op_name(self.func)


class OfEvent:
    """For results about one event (its count, its GEMMs): the event's index, op name, module
    and phase are read through the ``event`` they refer to, never copied."""

    __slots__ = ()

    @property
    def index(self) -> int:
        return self.event.index  # type: ignore[attr-defined]

    @property
    def op(self) -> str:
        return self.event.name  # type: ignore[attr-defined]

    @property
    def module(self) -> str:
        return self.event.module  # type: ignore[attr-defined]

    @property
    def phase(self) -> str:
        return self.event.phase  # type: ignore[attr-defined]


@dataclass(slots=True)
class StorageInfo:
    nbytes: int
    kind: StorageKind
    created_by: int | None  # event index, or None when it existed before the trace began
    released_after: int | None = None  # event index after which it was freed; None: still alive
    name: str | None = None  # parameter / buffer name where known


@dataclass
class Trace:
    """Every op of one step plus what the passes need to interpret it."""

    events: list[OpEvent]
    storages: dict[int, StorageInfo]
    module_types: dict[str, str]  # module path -> class name
    module_params: dict[str, int]  # module path -> parameters owned directly (not children)
    param_storages: dict[int, str]  # storage -> parameter name
    param_shapes: dict[str, tuple[int, ...]]  # every parameter name (tied ones too) -> shape
    module_output_bytes: dict[str, int]  # module path -> bytes its forward returned
    mode: str  # "train" | "inference"
    config: dict[str, Any]

    def by_phase(self, phase: str) -> list[OpEvent]:
        return [e for e in self.events if e.phase == phase]


def op_name(func: Any) -> str:
    schema = getattr(func, "_schema", None)
    if schema is not None:
        return schema.name.replace("::", ".")  # "aten::add" -> "aten.add"
    if isinstance(func, HigherOrderOperator):
        return f"higher_order.{func.name()}"  # as torch.ops.higher_order names it
    return str(func)


_DTYPE_NAMES = {
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.float64: "fp64",
    torch.int64: "int64",
    torch.int32: "int32",
    torch.int16: "int16",
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.bool: "bool",
    torch.complex64: "complex64",
}
for _name in ("float8_e4m3fn", "float8_e5m2"):
    if hasattr(torch, _name):
        _DTYPE_NAMES[getattr(torch, _name)] = "fp8"


def dtype_name(dtype: torch.dtype) -> str:
    """Short dtype names as users write them (fp32, bf16, ...)."""
    return _DTYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))
