"""Collectives and the copies distributed engines wrap around them.

A collective (``c10d`` and ``_c10d_functional`` ops: what DDP's reducer, FSDP2 and
``torch.distributed`` calls dispatch) moves bytes between GPUs, not through the math units:
its category is ``communication`` and ``kernels.collectives`` times it on the communication
stream (``passes.comm_timeline``). ``info["collective"]`` names its kind and
``info["bytes"]`` its size as nccl-tests counts it (all-reduce: the buffer; all-gather: the
gathered output; reduce-scatter: the input before scattering; all-to-all: the buffer), the
size the bus-bandwidth formulas take.

FSDP2's ``fsdp::all_gather_copy_in``, ``split_with_sizes_copy`` and ``chunk_cat`` are copy
kernels on the compute side (into and out of the flat communication buffers): bytes read
and written, like ``aten.cat``.
"""

from __future__ import annotations

import contextlib

import torch.distributed as dist

from nnperf.passes.costs.common import read_args
from nnperf.passes.costs.registry import (
    COMMUNICATION,
    MEMORY,
    OpCost,
    register,
    tensors,
    written_args,
)
from nnperf.trace.events import OpEvent, TensorMeta

#: c10d op -> (collective kind, which tensors give its nccl-tests size)
COLLECTIVES: dict[str, tuple[str, str]] = {
    "c10d.allreduce_": ("all_reduce", "input"),
    "c10d.allreduce_coalesced_": ("all_reduce", "input"),
    "_c10d_functional.all_reduce": ("all_reduce", "input"),
    "_c10d_functional.all_reduce_": ("all_reduce", "input"),
    "c10d._allgather_base_": ("all_gather", "output"),
    "c10d.allgather_": ("all_gather", "output"),
    "c10d.allgather_into_tensor_coalesced_": ("all_gather", "output"),
    "_c10d_functional.all_gather_into_tensor": ("all_gather", "output"),
    "c10d._reduce_scatter_base_": ("reduce_scatter", "input"),
    "c10d.reduce_scatter_": ("reduce_scatter", "input"),
    "c10d.reduce_scatter_tensor_coalesced_": ("reduce_scatter", "input"),
    "_c10d_functional.reduce_scatter_tensor": ("reduce_scatter", "input"),
    "c10d.alltoall_base_": ("all_to_all", "input"),
    "_c10d_functional.all_to_all_single": ("all_to_all", "input"),
    "c10d.broadcast_": ("broadcast", "input"),
    "_c10d_functional.broadcast": ("broadcast", "input"),
    "c10d.send": ("send_recv", "input"),
    "c10d.recv_": ("send_recv", "output"),
}


def collective_bytes(event: OpEvent, side: str) -> int:
    """The collective's size as nccl-tests counts it: the gathered (``output``) or the
    contributed-and-reduced (``input``) buffer. c10d's schemas carry no alias annotations:
    an argument named ``output...`` is written, the others (``tensors`` of an in-place
    all-reduce, ``input...``) are read; a functional collective returns its output."""
    outs: list[TensorMeta] = []
    ins: list[TensorMeta] = []
    schema = event.func._schema
    values = list(event.args) + [event.kwargs.get(a.name) for a in schema.arguments[len(event.args):]]
    for arg, value in zip(schema.arguments, values, strict=False):
        if isinstance(value, TensorMeta):
            found = [value]
        else:
            found = tensors(value) if isinstance(value, (list, tuple)) else []
        (outs if arg.name.startswith("output") else ins).extend(found)
    outs = outs or list(event.outputs)
    chosen = outs if side == "output" else ins or outs
    return sum(t.nbytes for t in chosen)


def _collective(event: OpEvent) -> OpCost:
    kind, side = COLLECTIVES[event.name]
    size = collective_bytes(event, side)
    return OpCost(COMMUNICATION, info={"collective": kind, "bytes": size})


def _fsdp_copy(event: OpEvent) -> OpCost:
    return OpCost(MEMORY, reads=read_args(event), writes=event.outputs or written_args(event))


def _present(names: tuple[str, ...]) -> tuple[str, ...]:
    from nnperf.passes.costs.registry import resolve_op

    return tuple(n for n in names if resolve_op(n) is not None)


if dist.is_available():
    # Collectives of a torch without some of them (older releases) cannot be in its traces.
    register(*_present(tuple(COLLECTIVES)))(_collective)
    # defines the fsdp:: copy ops (torch < 2.6: no FSDP2, so no fsdp:: ops in any trace)
    with contextlib.suppress(ImportError):
        import torch.distributed.fsdp._fully_shard._fsdp_collectives  # noqa: F401
    register(*_present(("fsdp.all_gather_copy_in", "fsdp.split_with_sizes_copy", "fsdp.chunk_cat")))(_fsdp_copy)
