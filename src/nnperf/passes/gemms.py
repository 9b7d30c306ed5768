"""GEMM lowering: every matrix product and convolution of the step as (M, N, K, batch, dtype, role).

Roles follow the three GEMMs of training: ``forward``; ``grad_input`` (reads the weight);
``grad_weight`` (produces the weight's gradient). A product in backward that touches no
weight (e.g. attention scores in an unfused model) is ``backward``. The first layer of a
network has no ``grad_input`` because its input needs no gradient: an n-layer MLP has 3n-1.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from nnperf.passes.costs.matmul import gemm_shapes
from nnperf.passes.count import weight_storages
from nnperf.trace.events import OpEvent, Trace, dtype_name


@dataclass(frozen=True, slots=True)
class Gemm:
    index: int  # event index
    op: str
    module: str
    phase: str
    role: str
    m: int
    n: int
    k: int
    batch: int
    dtype: str

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k * self.batch

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["flops"] = self.flops
        return d


def lower_gemms(trace: Trace) -> list[Gemm]:
    weights = weight_storages(trace)
    shapes_by_module = _weight_shapes_by_module(trace)
    out: list[Gemm] = []
    for ev in trace.events:
        if ev.free:
            continue
        for shape in gemm_shapes(ev):
            role = shape.role or _role(ev, weights, shapes_by_module.get(ev.module, set()))
            out.append(
                Gemm(
                    index=ev.index,
                    op=ev.name,
                    module=ev.module,
                    phase=ev.phase,
                    role=role,
                    m=shape.m,
                    n=shape.n,
                    k=shape.k,
                    batch=shape.batch,
                    dtype=dtype_name(_operand_dtype(ev)),
                )
            )
    return out


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


def _operand_dtype(ev: OpEvent):
    return ev.inputs[-1].dtype if ev.inputs else ev.outputs[0].dtype
