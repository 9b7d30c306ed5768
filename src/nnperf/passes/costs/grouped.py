"""Grouped GEMMs (``aten._grouped_mm``: a mixture of experts' expert GEMMs in one op) and the
routing bookkeeping around them (``histc``, ``bincount``, ``nonzero``).

``_grouped_mm(a, b, offs)`` multiplies group by group; ``offs`` holds each group's cumulative
end along the dimension the groups split (``torch/_meta_registrations.py``,
``_create_grouped_mm_output_tensor``; ``aten/src/ATen/native/GroupedMMUtils.h``):

- a 2-D x b 3-D (the forward, and the input gradient): a's rows split by ``offs``, group g
  is a[rows_g] @ b[g] -> (rows_g, N, K);
- a 3-D x b 2-D: b's columns split, group g is a[g] @ b[:, cols_g] -> (M, cols_g, K);
- a 2-D x b 2-D (the weight gradient, a = x^T): the reduction splits, group g is
  a[:, k_g] @ b[k_g] -> (M, N, k_g), out (G, M, N);
- a 3-D x b 3-D: a batched product, no offsets.

Its autograd (checked on torch 2.13): grad_a = _grouped_mm(grad, b^T, offs) and
grad_b = _grouped_mm(a^T, grad, offs), i.e. again grouped GEMMs, covered here.

Group sizes: the offsets' values where the trace knows them (``OpEvent.values``: a real
trace, or assumed routing, ``trace.routing``), else an even split (the trace states it).
FLOPs = sum over groups of 2 M N K; each group is lowered to its own GEMM, so expert GEMMs are
counted (and listed) per expert.
"""

from __future__ import annotations

from nnperf.kernels.grouped_gemm import GROUPED_MM, even_split, sizes_from_offsets
from nnperf.passes.costs.common import read_args
from nnperf.passes.costs.matmul import GemmShape, register_shapes
from nnperf.passes.costs.registry import GEMM, MEMORY, REDUCTION, OpCost, register
from nnperf.trace.events import OpEvent


def groups(event: OpEvent) -> list[GemmShape]:
    """The GEMM of every non-empty group, in group order (role set in backward)."""
    a, b = event.args[0], event.args[1]
    out = event.outputs[0]
    offsets = (event.values or {}).get("offs")
    role = _role(event)
    if len(a.shape) == 3 and len(b.shape) == 3:
        return [GemmShape(a.shape[1], b.shape[2], a.shape[2], role=role) for _ in range(a.shape[0])]
    if len(a.shape) == 2 and len(b.shape) == 3:  # rows split
        sizes = _sizes(offsets, a.shape[0], b.shape[0])
        return [GemmShape(m, b.shape[2], a.shape[1], role=role) for m in sizes if m]
    if len(a.shape) == 3:  # 3-D x 2-D: columns split
        sizes = _sizes(offsets, b.shape[1], a.shape[0])
        return [GemmShape(a.shape[1], n, a.shape[2], role=role) for n in sizes if n]
    sizes = _sizes(offsets, a.shape[1], out.shape[0])  # 2-D x 2-D: the reduction splits
    return [GemmShape(a.shape[0], b.shape[1], k, role=role or "grad_weight") for k in sizes if k]


def _sizes(offsets: tuple[int, ...] | None, total: int, count: int) -> list[int]:
    return sizes_from_offsets(offsets, total) if offsets is not None else even_split(total, count)


def _role(event: OpEvent) -> str | None:
    """In backward a 2-D x 2-D product makes the weight's gradient; the others read the weight."""
    if event.phase != "backward":
        return None
    a, b = event.args[0], event.args[1]
    return "grad_weight" if len(a.shape) == 2 and len(b.shape) == 2 else "grad_input"


register_shapes(GROUPED_MM, groups)


@register(GROUPED_MM)
def _grouped_mm(event: OpEvent) -> OpCost:
    shapes = groups(event)
    macs = sum(g.macs for g in shapes)
    return OpCost(
        GEMM, flops=2 * macs, macs=macs, reads=[t for t in event.inputs if t.dtype.is_floating_point],
        writes=event.outputs,
        info={"groups": len(shapes), "even_split": (event.values or {}).get("offs") is None
              and not (len(event.args[0].shape) == 3 and len(event.args[1].shape) == 3)},
    )


@register("aten.histc", "aten.bincount")
def _histogram(event: OpEvent) -> OpCost:
    """Counting values into bins (tokens per expert): one add per input element into its bin,
    as a sum counts one per element; the bin index is address arithmetic."""
    x = event.inputs[0]
    return OpCost(REDUCTION, flops=float(x.numel), reads=read_args(event), writes=event.outputs)


@register("aten.nonzero", "aten.argwhere")
def _nonzero(event: OpEvent) -> OpCost:
    """A compaction: the input read once, the indices of its nonzero elements written."""
    return OpCost(MEMORY, reads=read_args(event), writes=event.outputs)
