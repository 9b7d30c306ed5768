"""Runs a test's step on real torch.distributed ranks: spawned processes on this CPU joined by
gloo, so the distributed tests compare nnperf's fake process group with the engines' own run.

Why the careful exit: a rank that leaves through interpreter finalization while gloo's threads
still hold work can abort ("terminate called without an active exception", SIGABRT; seen in CI
on torch 2.14.1+cu130; pytorch/pytorch#179291, an abandoned PR, describes the same crash for
processes that leave without destroying their group). Every rank therefore hands its result over
first (pickled by value, so nothing of it depends on the rank still running), waits for the
others at a barrier, destroys the group and leaves with ``os._exit``: nothing is left for
finalization to tear down. A rank that fails or hangs past the deadline fails the
test and the others are killed, so pytest never waits on them.
"""

from __future__ import annotations

import os
import pickle
import queue as queue_module
import socket
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils._python_dispatch import TorchDispatchMode


def run_ranks(worker: Callable[[int], Any], world: int, timeout_s: float) -> dict[int, Any]:
    """``worker(rank)`` on ``world`` gloo ranks; what each returned, by rank. ``worker`` must be a
    module-level function (it is pickled by name into the spawned processes)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results_queue = mp.get_context("spawn").Queue()
    ranks = mp.start_processes(_rank_main, args=(worker, world, port, results_queue), nprocs=world,
                               start_method="spawn", join=False)
    results: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(results) < world:  # read while the ranks run: a large result cannot fill the pipe
            try:
                rank, value = results_queue.get(timeout=1)
                results[rank] = pickle.loads(value)
            except queue_module.Empty:
                ranks.join(timeout=0)  # raises with the rank's own error when one failed
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{world - len(results)} of {world} gloo ranks gave no result "
                                       f"in {timeout_s} s") from None
        while not ranks.join(timeout=1):
            if time.monotonic() > deadline:
                raise TimeoutError(f"gloo ranks did not exit within {timeout_s} s")
    finally:
        for process in ranks.processes:
            if process.is_alive():
                process.kill()
    return results


def _rank_main(rank: int, worker: Callable[[int], Any], world: int, port: int, results_queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    # pickled here, by value: a tensor put on a torch.multiprocessing queue as it is travels as a
    # shared-memory handle that its rank must still serve when the parent reads it, and this rank
    # exits right after the barrier (seen in CI: ConnectionResetError in the parent's get)
    results_queue.put((rank, pickle.dumps(worker(rank))))
    results_queue.close()
    results_queue.join_thread()
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


#: The c10d ops the real runs' engines issue, by nnperf's collective kind.
_KIND = {"c10d.allreduce_": "all_reduce", "c10d._allgather_base_": "all_gather",
         "c10d._reduce_scatter_base_": "reduce_scatter", "_c10d_functional.all_to_all_single": "all_to_all",
         "c10d.broadcast_": "broadcast"}


#: DTensor's functional collectives (tensor parallelism), by the same kinds.
_FUNCTIONAL = {"_c10d_functional.all_reduce": "all_reduce", "_c10d_functional.all_gather_into_tensor": "all_gather",
               "_c10d_functional.reduce_scatter_tensor": "reduce_scatter"}


class SeenCollectives(TorchDispatchMode):
    """The collectives a real rank issues, as (kind, nccl-tests bytes), counted from the op's
    own arguments: the buffer an all-reduce or a broadcast writes, the gathered output, a reduce-scatter's
    input (N x its output), the larger of an all-to-all's sent and received rows. ``functional``:
    also DTensor's functional collectives (seen on the local tensors, not on the DTensors)."""

    def __init__(self, functional: bool = False) -> None:
        super().__init__()
        self.seen: list[tuple[str, int]] = []
        self.functional = functional

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.utils._python_dispatch import is_traceable_wrapper_subclass_type

        if self.functional and any(is_traceable_wrapper_subclass_type(t) for t in types):
            return NotImplemented  # a DTensor: its collectives are seen on its local tensors
        name = f"{func.namespace}.{func._schema.name.split('::')[1]}"
        if self.functional and name in _FUNCTIONAL:
            out = func(*args, **(kwargs or {}))
            tensor = out if _FUNCTIONAL[name] == "all_gather" else args[0]  # (input, ..., group name) -> output
            self.seen.append((_FUNCTIONAL[name], tensor.numel() * tensor.element_size()))
            return out
        if name in _KIND:
            if name == "c10d._reduce_scatter_base_":
                nbytes = args[1].numel() * args[1].element_size()
            elif name == "_c10d_functional.all_to_all_single":
                row = args[0].numel() // max(1, args[0].shape[0]) * args[0].element_size()
                received = sum(args[1]) if args[1] is not None else args[0].shape[0]
                nbytes = row * max(args[0].shape[0], received)
            else:
                first = args[0][0] if isinstance(args[0], list) else args[0]  # the written buffer
                nbytes = first.numel() * first.element_size()
            self.seen.append((_KIND[name], nbytes))
        return func(*args, **(kwargs or {}))


def wrap_data_parallel(model: torch.nn.Module, kind: str, bucket_bytes: int | None = None) -> torch.nn.Module:
    """The two-linear test model under DDP (``bucket_bytes``: its bucket cap) or FSDP2 (each
    linear a unit, the root unresharded after forward), as the distributed tests compare."""
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    if kind == "ddp":
        return DistributedDataParallel(model, **({"bucket_cap_mb": bucket_bytes / 2**20} if bucket_bytes else {}))
    for layer in (model[0], model[2]):
        fully_shard(layer)
    return fully_shard(model, reshard_after_forward=False)
