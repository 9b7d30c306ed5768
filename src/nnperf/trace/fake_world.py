"""A fake process group for tracing one rank of a multi-GPU layout in this process.

PyTorch's fake process group (``torch.testing._internal.distributed.fake_pg``) runs every
collective as a no-op, so the engines (DTensor, FSDP2, DDP, pipelining) run their real code
paths, shapes and groups included, with no other process. ``session`` keeps one between the
traces of a search (its device meshes and DTensor's sharding decisions are reused);
``clear_sharding_caches`` forgets what DTensor cached for another rank.
"""

from __future__ import annotations

import atexit
import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist


@contextlib.contextmanager
def fake_process_group(world: int, rank: int = 0) -> Iterator[None]:
    """A process group of ``world`` ranks whose collectives do nothing (this process is
    ``rank``): engines run their real code paths, shapes and groups included."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    release_session()
    if dist.is_initialized():
        raise RuntimeError("a process group is already initialized in this process")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    clear_sharding_caches()
    try:
        yield
    finally:
        clear_sharding_caches()
        dist.destroy_process_group()


#: The fake process group ``trace_rank`` keeps between traces of the same (world, rank): its
#: device meshes and DTensor's sharding decisions are reused by the next trace of a search
#: (DTensor recomputes them under a fake mode, ~10 ms each, hundreds per trace).
_SESSION: dict[str, Any] = {"key": None, "meshes": {}, "memo": {}}


def session(world: int, rank: int) -> dict[str, Any]:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if _SESSION["key"] != (world, rank):
        release_session()
        if dist.is_initialized():
            raise RuntimeError("a process group is already initialized in this process")
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
        clear_sharding_caches()
        _SESSION.update(key=(world, rank), meshes={}, memo={})
    return _SESSION


def release_session() -> None:
    """Destroy the fake process group kept between traces (the next trace makes a new one)."""
    if _SESSION["key"] is None:
        return
    clear_sharding_caches()
    _SESSION.update(key=None, meshes={}, memo={})
    if dist.is_initialized():
        dist.destroy_process_group()


atexit.register(release_session)


def sharding_propagator() -> Any:
    from torch.distributed.tensor import DTensor

    return DTensor._op_dispatcher.sharding_propagator


def clear_sharding_caches() -> None:
    """DTensor caches its sharding decisions per op schema, local view shapes included: right
    in a real run (one rank per process), wrong when this process traces another rank next."""
    sharding_propagator().propagate_op_sharding.cache_clear()
    clear = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)
    if clear is not None:
        clear()
