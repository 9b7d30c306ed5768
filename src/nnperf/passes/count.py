"""Counting pass: FLOPs, MACs and bytes per op, split into input, weight and output bytes.

Weight bytes are reads of parameters and of their casts (under autocast a bf16 copy of a
weight is still weight traffic), so the "bandwidth needed for weights" figure stays right
in mixed precision. The same walk lowers each matrix product to its GEMMs
(``passes.gemms``): one pass over the trace, one set of weight storages, and each
``OpCount`` holds its GEMMs, so nothing later lowers them again or joins them by index.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import nnperf.passes.costs  # noqa: F401  (registers every formula)
from nnperf.passes.costs.factories import allocation
from nnperf.passes.costs.registry import OpCost, lookup
from nnperf.passes.gemms import Gemm, GemmLowering
from nnperf.trace.events import KIND_PARAM, OfEvent, OpEvent, TensorMeta, Trace

_WEIGHT_PRESERVING = {"aten._to_copy", "aten.clone", "aten.copy", "aten.contiguous", "aten.t"}
#: FSDP2's copy-out of an all-gather (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py,
#: ``foreach_all_gather_copy_out``): ``split_with_sizes_copy(all_gather_output, ..., out=...)``
#: writes each parameter's gathered (unsharded) storage, the weight the module's GEMMs read.
_GATHERED_PARAMETERS = "fsdp.split_with_sizes_copy"


class BytesMoved:
    """For counts that split the bytes they move at minimum three ways (``bytes_in``,
    ``bytes_weights``, ``bytes_out``) and carry ``flops``: one op, or a group of ops."""

    __slots__ = ()

    @property
    def bytes(self) -> float:
        return self.bytes_in + self.bytes_weights + self.bytes_out  # type: ignore[attr-defined]

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved at minimum (arithmetic intensity)."""
        return self.flops / self.bytes if self.bytes else 0.0  # type: ignore[attr-defined]


@dataclass(slots=True, eq=False)
class OpCount(OfEvent, BytesMoved):
    """One op of the trace with its cost; ``covered`` is False when no formula exists.

    It refers to its ``OpEvent`` (index, name, module, phase are the event's) rather than
    copying them, and holds the GEMMs the op was lowered to."""

    event: OpEvent = field(repr=False)
    category: str
    flops: float
    macs: float
    bytes_in: float
    bytes_weights: float
    bytes_out: float
    covered: bool
    info: dict[str, Any] = field(default_factory=dict)
    gemms: tuple[Gemm, ...] = ()

    def __repr__(self) -> str:
        return (f"OpCount({self.index}, {self.op!r}, module={self.module!r}, phase={self.phase!s}, "
                f"category={self.category!s}, flops={self.flops:g}, bytes={self.bytes:g})")


def weight_storages(trace: Trace) -> set[int]:
    """Parameter storages plus copies/casts made from them, and FSDP2's gathered parameters
    (the ``out`` tensors of its copy-out, which the trace records after the gathered input)."""
    weights = {sid for sid, info in trace.storages.items() if info.kind == KIND_PARAM}
    for ev in trace.events:
        if ev.name in _WEIGHT_PRESERVING and ev.inputs and ev.outputs and ev.inputs[0].storage in weights:
            weights.update(t.storage for t in ev.outputs)
        elif ev.name == _GATHERED_PARAMETERS:
            weights.update(t.storage for t in ev.inputs[1:])
    return weights


def count_ops(trace: Trace) -> list[OpCount]:
    """Apply the formula registry to every op that does work (views and aliases are free),
    and lower the matrix products among them to GEMMs."""
    weights = weight_storages(trace)
    lower = GemmLowering(trace, weights)
    # copies the framework a traced layout stands for does not make, only their buffers
    # (``trace.config["not_copied"]``: Megatron-LM's sequence-first tensors,
    # ``trace.parallel.sequence_first``)
    not_copied = frozenset(trace.config.get("not_copied", ()))
    counts: list[OpCount] = []
    for ev in trace.events:
        if ev.free:
            continue
        formula = allocation if ev.index in not_copied else lookup(ev)
        count = _uncovered(ev, weights) if formula is None else _covered(ev, formula(ev), weights)
        count.gemms = lower(ev)
        counts.append(count)
    return counts


def _distinct(metas) -> list[TensorMeta]:
    seen, out = set(), []
    for m in metas:
        key = (m.storage, m.storage_offset, m.shape, m.stride)
        if key not in seen:
            seen.add(key)
            out.append(m)
    return out


def _covered(ev: OpEvent, cost: OpCost, weights: set[int]) -> OpCount:
    reads = _distinct(cost.reads)
    bytes_w = sum(m.nbytes for m in reads if m.storage in weights)
    bytes_in = sum(m.nbytes for m in reads if m.storage not in weights) + cost.extra_read_bytes
    bytes_out = sum(m.nbytes for m in _distinct(cost.writes)) + cost.extra_write_bytes
    return OpCount(
        event=ev,
        category=cost.category,
        flops=float(cost.flops),
        macs=float(cost.macs),
        bytes_in=float(bytes_in),
        bytes_weights=float(bytes_w),
        bytes_out=float(bytes_out),
        covered=True,
        info=dict(cost.info),
    )


def _uncovered(ev: OpEvent, weights: set[int]) -> OpCount:
    """No formula: zero FLOPs is unknown, not zero, so the bytes it touches are still shown
    (split like a covered op's: reads of parameters and their casts are weight bytes)."""
    reads = _distinct(ev.inputs)
    bytes_w = sum(m.nbytes for m in reads if m.storage in weights)
    touched_in = sum(m.nbytes for m in reads if m.storage not in weights)
    touched_out = sum(m.nbytes for m in _distinct(ev.outputs))
    return OpCount(
        event=ev,
        category="uncovered",
        flops=0.0,
        macs=0.0,
        bytes_in=float(touched_in),
        bytes_weights=float(bytes_w),
        bytes_out=float(touched_out),
        covered=False,
    )
