"""Which dispatched ops are collectives, their kind, and their size as nccl-tests counts it.

Read by the tracer of a rank (``trace.distributed``) and the cost formulas
(``passes.costs.communication``): all-reduce: the buffer; all-gather: the gathered output;
reduce-scatter: the input before scattering; broadcast: the buffer; all-to-all: the larger of
what this rank sends and what it receives (equal unless the splits are uneven, as expert
parallelism's are when one rank's experts draw more tokens: it waits for the larger).
"""

from __future__ import annotations

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


