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

``_c10d_functional.wait_tensor`` (what a functional collective's result, a DTensor
redistribution's included, waits on) launches no kernel: it makes the current stream wait for
the collective's work (``c10d::wait_tensor`` -> ``Work::wait``, an event wait on the stream;
the host does not block). It costs its dispatch only; the ops that read the result wait for the
collective through their inputs (``passes.comm_timeline``). Without a formula it was timed as
a copy of the whole tensor.
"""

from __future__ import annotations

import torch.distributed as dist

from nnperf.passes.costs.common import bind, listed, read_args
from nnperf.passes.costs.registry import (
    COMMUNICATION,
    HOST,
    MEMORY,
    OpCost,
    register,
    register_defined_on_import,
    written_args,
)
from nnperf.trace.collectives import COLLECTIVES, collective_bytes
from nnperf.trace.events import OpEvent


def _collective(event: OpEvent) -> OpCost:
    kind, side = COLLECTIVES[event.name]
    size = collective_bytes(event, side)
    return OpCost(COMMUNICATION, info={"collective": kind, "bytes": size})


def _fsdp_copy(event: OpEvent) -> OpCost:
    return OpCost(MEMORY, reads=read_args(event), writes=event.outputs or written_args(event))


def _fsdp_copy_in(event: OpEvent) -> OpCost:
    """``all_gather_copy_in(all_gather_inputs, all_gather_output, ...)``: its CUDA kernel copies
    the shards into the rank's slice of the buffer (its first output), not the whole buffer."""
    return OpCost(MEMORY, reads=listed(bind(event)["all_gather_inputs"]), writes=event.outputs[:1])


def _wait(event: OpEvent) -> OpCost:
    return OpCost(HOST, info={"stream_wait": True})


def _present(names: tuple[str, ...]) -> tuple[str, ...]:
    from nnperf.passes.costs.registry import resolve_op

    return tuple(n for n in names if resolve_op(n) is not None)


if dist.is_available():
    # Collectives of a torch without some of them (older releases) cannot be in its traces.
    register(*_present(tuple(COLLECTIVES)))(_collective)
    register(*_present(("_c10d_functional.wait_tensor",)))(_wait)
    # FSDP2's module defines the fsdp:: copy ops when imported (torch < 2.6: no FSDP2, so no
    # fsdp:: ops in any trace)
    register_defined_on_import(
        "torch.distributed.fsdp._fully_shard._fsdp_collectives",
        "fsdp.split_with_sizes_copy", "fsdp.chunk_cat")(_fsdp_copy)
    register_defined_on_import(
        "torch.distributed.fsdp._fully_shard._fsdp_collectives", "fsdp.all_gather_copy_in")(_fsdp_copy_in)
