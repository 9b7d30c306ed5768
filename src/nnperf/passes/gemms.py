"""GEMM lowering: every matrix product and convolution of the step as (M, N, K, batch, dtype, role).

Roles follow the three GEMMs of training: ``forward``; ``grad_input`` (reads the weight);
``grad_weight`` (produces the weight's gradient). A product in backward that touches no
weight (e.g. attention scores in an unfused model) is ``backward``. The first layer of a
network has no ``grad_input`` because its input needs no gradient: an n-layer MLP has 3n-1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nnperf.passes.costs.matmul import gemm_shapes
from nnperf.trace.events import OfEvent, OpEvent, Trace, dtype_name


@dataclass(frozen=True, slots=True, eq=False)
class Gemm(OfEvent):
    """One GEMM of an op; index, op name, module and phase are its event's."""

    event: OpEvent = field(repr=False)
    role: str
    m: int
    n: int
    k: int
    batch: int
    dtype: str

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k * self.batch

    @property
    def shape_key(self) -> tuple:
        """What makes two GEMMs the same kernel: phase, role, sizes and dtype."""
        return (self.phase, self.role, self.m, self.n, self.k, self.batch, self.dtype)

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index, "op": self.op, "module": self.module, "phase": self.phase,
            "role": self.role, "m": self.m, "n": self.n, "k": self.k, "batch": self.batch,
            "dtype": self.dtype, "flops": self.flops,
        }


class GemmLowering:
    """Lowers one op at a time, for the counting pass's walk over the trace in its order (it
    knows which storages are weights; the module's weight shapes tell a weight gradient). Those
    shapes are the module's parameters', and the weights its forward GEMMs read as it lowers
    them: under FSDP2 the parameters are shards and the GEMMs read the gathered weights, whose
    gradient is what the weight-gradient GEMM writes."""

    def __init__(self, trace: Trace, weights: set[int]):
        self.weights = weights
        self.shapes_by_module = _weight_shapes_by_module(trace)

    def __call__(self, ev: OpEvent) -> tuple[Gemm, ...]:
        shapes = gemm_shapes(ev)
        if not shapes:
            return ()
        module_shapes = self.shapes_by_module.setdefault(ev.module, set())
        if ev.phase == "forward":
            read = {tuple(t.shape) for t in ev.inputs if t.storage in self.weights}
            module_shapes.update(read | {tuple(reversed(s)) for s in read})
        dtype = dtype_name(operand_dtype(ev))
        out = []
        for shape in shapes:
            role = shape.role or _role(ev, self.weights, module_shapes)
            out.append(Gemm(event=ev, role=role, m=shape.m, n=shape.n, k=shape.k, batch=shape.batch, dtype=dtype))
        return tuple(out)


def step_gemms(ops: list) -> list[Gemm]:
    """Every GEMM of the step in trace order: the GEMMs the counting pass attached to each op."""
    return [g for op in ops for g in op.gemms]


def _weight_shapes_by_module(trace: Trace) -> dict[str, set[tuple[int, ...]]]:
    by_module: dict[str, set[tuple[int, ...]]] = {}
    for name, shape in trace.param_shapes.items():
        module = name.rsplit(".", 1)[0] if "." in name else ""
        by_module.setdefault(module, set()).update({shape, tuple(reversed(shape))})
    return by_module


def _role(ev: OpEvent, weights: set[int], module_weight_shapes: set[tuple[int, ...]]) -> str:
    if ev.phase != "backward":
        return ev.phase
    if any(t.storage in weights for t in ev.inputs):
        return "grad_input"
    if ev.outputs and ev.outputs[0].shape in module_weight_shapes:
        return "grad_weight"
    return "backward"


def operand_dtype(ev: OpEvent):
    """The dtype a matrix op computes in: its last floating operand's (the weight of a linear
    or convolution, which autocast casts like the input; a grouped GEMM's int32 offsets come
    after its matrices)."""
    for t in reversed(ev.inputs):
        if t.dtype.is_floating_point:
            return t.dtype
    return ev.inputs[-1].dtype if ev.inputs else ev.outputs[0].dtype
