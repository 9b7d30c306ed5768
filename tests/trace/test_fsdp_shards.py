"""FSDP2's shards read from ``LazyChunks`` are the views torch's own chunking makes, and a
model sharded under ``one_rank_chunks`` is sharded as FSDP2 shards it without it."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.fsdp._fully_shard._fsdp_common import _chunk_with_empty

from nnperf.trace.fake_world import fake_process_group
from nnperf.trace.fsdp_shards import LazyChunks, one_rank_chunks


def _view(t: torch.Tensor) -> tuple:
    return tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.untyped_storage().data_ptr()


@pytest.mark.parametrize(("shape", "chunks", "dim"), [
    ((1024, 8), 1024, 0), ((10, 3), 4, 0), ((3, 5), 8, 0), ((7,), 7, 0), ((6, 10), 4, 1), ((1, 2), 3, 0),
])
def test_every_chunk_is_torchs(shape, chunks, dim):
    tensor = torch.arange(torch.Size(shape).numel(), dtype=torch.float32).reshape(shape)
    expected = _chunk_with_empty(tensor, chunks, dim)
    lazy = LazyChunks(tensor, chunks, dim)
    assert len(lazy) == len(expected) == chunks
    for i in [*range(chunks), -1]:
        got, want = lazy[i], expected[i]
        if want.numel():  # a view of the same storage at the same place
            assert _view(got) == _view(want)
        else:  # padding: an empty tensor of its own, as torch appends it
            assert (tuple(got.shape), got.dtype) == (tuple(want.shape), want.dtype)
    assert [tuple(c.shape) for c in lazy[1:3]] == [tuple(c.shape) for c in expected[1:3]]
    with pytest.raises(IndexError):
        lazy[chunks]


def _sharded(lazy: bool, rank: int) -> list[tuple]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(13, 7), nn.Linear(7, 3, bias=False))
    with fake_process_group(8, rank):
        mesh = init_device_mesh("cpu", (8,))
        with one_rank_chunks() if lazy else torch.no_grad():
            fully_shard(model, mesh=mesh)
        return [(n, p.to_local().tolist(), tuple(p.shape), p.placements) for n, p in model.named_parameters()]


@pytest.mark.parametrize("rank", [0, 3, 7])
def test_fully_shard_shards_the_same(rank):
    """Shards' values, global shapes and placements; uneven shards included (7 rows over 8
    ranks leave rank 7 an empty shard)."""
    assert _sharded(True, rank) == _sharded(False, rank)
