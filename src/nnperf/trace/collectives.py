"""Which dispatched ops are collectives, their kind, and their size as nccl-tests counts it;
a traced step's collectives as records (``Collective``, ``collectives_of``).

Read by the tracer of a rank (``trace.distributed``) and the cost formulas
(``passes.costs.communication``): all-reduce: the buffer; all-gather: the gathered output;
reduce-scatter: the input before scattering; broadcast: the buffer; all-to-all: the larger of
what this rank sends and what it receives (equal unless the splits are uneven, as expert
parallelism's are when one rank's experts draw more tokens: it waits for the larger).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist

from nnperf.trace.events import OpEvent, TensorMeta, Trace

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
    "c10d.alltoall_base_": ("all_to_all", "larger"),
    "_c10d_functional.all_to_all_single": ("all_to_all", "larger"),
    "c10d.broadcast_": ("broadcast", "input"),
    "_c10d_functional.broadcast": ("broadcast", "input"),
    "c10d.send": ("send_recv", "input"),
    "c10d.recv_": ("send_recv", "input"),  # its ``tensors`` are the received buffers
}


def collective_bytes(event: OpEvent, side: str) -> int:
    """The collective's size as nccl-tests counts it: the gathered (``output``) or the
    contributed-and-reduced (``input``) buffer, or the ``larger`` of the two. c10d's schemas carry no alias annotations:
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
            found = [v for v in value if isinstance(v, TensorMeta)] if isinstance(value, (list, tuple)) else []
        (outs if arg.name.startswith("output") else ins).extend(found)
    outs = outs or list(event.outputs)
    if side == "larger":
        return max(sum(t.nbytes for t in outs), sum(t.nbytes for t in ins))
    chosen = outs if side == "output" else ins or outs
    return sum(t.nbytes for t in chosen)


@dataclass(frozen=True)
class Collective:
    """One collective of the traced step, as the engine issued it."""

    index: int  # its event in the trace
    kind: str  # all_reduce | all_gather | reduce_scatter | all_to_all | broadcast | send_recv
    bytes: int  # nccl-tests size (see passes.costs.communication)
    group_size: int
    group_ranks: tuple[int, ...]
    phase: str
    module: str
    group: str = ""  # the process group's name: one NCCL communicator, one stream

    @property
    def stream(self) -> tuple[str, tuple[int, ...]]:
        """The stream it runs on: its communicator's (a point-to-point pair has its own)."""
        return (self.group, tuple(sorted(self.group_ranks)) if self.kind == "send_recv" else ())

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "bytes": self.bytes, "group_size": self.group_size,
                "phase": self.phase, "module": self.module, "index": self.index}


def collectives_of(trace: Trace) -> list[Collective]:
    """The trace's collectives with their groups (resolved while the process group lives)."""
    out = []
    for event in trace.events:
        spec = COLLECTIVES.get(event.name)
        if spec is None:
            continue
        ranks, name = _group_of(event)
        if spec[0] == "send_recv":  # (tensors, group, peer's rank in the group, tag): the pair
            me, peer = dist.get_rank(), ranks[event.args[2]]
            ranks = (me, peer) if event.name == "c10d.send" else (peer, me)
        out.append(Collective(event.index, spec[0], collective_bytes(event, spec[1]), len(ranks),
                              ranks, event.phase, event.module, name))
    return out


def on_own_groups(collectives: list[Collective], groups: list[Any]) -> list[Collective]:
    """``collectives`` with each one issued over a group not among ``groups`` (the traced
    layout's own process groups) named as the one of ``groups`` with its ranks, where one has.

    DTensor caches its sharding decisions by device mesh, and a mesh is equal to any other of the
    same ranks and dimension names: a trace made after one of another layout in the same process
    (a plan's search: FSDP's TP x shard mesh, then ZeRO-1's TP x replicate one) issues its
    tensor-parallel collectives over the earlier mesh's group of the same ranks. Named as their
    own layout's, they are found where the trace looks for its tensor- and data-parallel groups
    (Megatron-LM's sequence-first copies, the userbuffers overlap, FP8 gathers, the once-per-step
    synchronization): a layout is planned the same whatever was traced before it."""
    own = {g.group_name for g in groups}
    by_ranks: dict[tuple[int, ...], set[str]] = {}
    for g in groups:
        by_ranks.setdefault(tuple(dist.get_process_group_ranks(g)), set()).add(g.group_name)
    out = []
    for c in collectives:
        names = by_ranks.get(c.group_ranks, set()) if c.group not in own and c.kind != "send_recv" else set()
        out.append(replace(c, group=next(iter(names))) if len(names) == 1 else c)
    return out


def _group_of(event: Any) -> tuple[tuple[int, ...], str]:
    """The ranks and name of the process group a collective ran on."""
    for value in list(event.args) + list(event.kwargs.values()):
        group = _as_group(value)
        if group is not None:
            return tuple(dist.get_process_group_ranks(group)), group.group_name
    return tuple(range(dist.get_world_size())), dist.group.WORLD.group_name


def _as_group(value: Any) -> Any:
    if isinstance(value, dist.ProcessGroup):
        return value
    if isinstance(value, torch.ScriptObject):
        try:
            return dist.ProcessGroup.unbox(value)
        except (RuntimeError, TypeError):
            return None
    if isinstance(value, str):  # functional collectives name their group
        try:
            return dist.distributed_c10d._resolve_process_group(value)
        except (RuntimeError, ValueError, KeyError):
            return None
    return None
