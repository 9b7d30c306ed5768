"""FSDP2's parameter sharding made for one rank only.

``fully_shard`` finds each parameter's shard by chunking it over the whole shard group
(``_fsdp_common._chunk_with_empty``: ``torch.chunk`` padded with empty tensors to one chunk per
rank) and then reads two chunks of the list: its own rank's and the first (the padded shard
size). On fake tensors every chunk is a fake tensor of its own, so a 70B model sharded over 1024
ranks made some two million views per trace, a third of a plan's time, for two that are read.

``one_rank_chunks`` hands FSDP2's parameter code a sequence that makes a chunk when it is read:
the same view ``torch.chunk`` makes (``split``'s pieces are ``narrow`` views: same size,
stride and storage offset) or, beyond the last piece, the same empty tensor. Nothing else
changes: the chunks are made while the model is wrapped, before the step is recorded, and the
chunks of the recorded step's collectives (``_fsdp_collectives``) are not touched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch


class LazyChunks(Sequence):
    """``_chunk_with_empty(tensor, num_chunks, dim)`` as a sequence that makes each chunk on
    first read (for a non-empty dimension; an empty one is chunked at once, as torch does)."""

    def __init__(self, tensor: torch.Tensor, num_chunks: int, dim: int) -> None:
        self._tensor, self._count, self._dim = tensor, num_chunks, dim
        self._size = tensor.size(dim)
        self._split = -(-self._size // num_chunks)  # torch.chunk's piece size
        self._pieces = -(-self._size // self._split) if self._size else 0
        self._made: dict[int, torch.Tensor] = {}

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._count))]
        if index < 0:
            index += self._count
        if not 0 <= index < self._count:
            raise IndexError(index)
        made = self._made.get(index)
        if made is None:
            if index < self._pieces:
                start = index * self._split
                made = self._tensor.narrow(self._dim, start, min(self._split, self._size - start))
            else:
                made = self[0].new_empty(0)
            self._made[index] = made
        return made


@contextlib.contextmanager
def one_rank_chunks() -> Iterator[None]:
    """FSDP2's parameter initialization reads its shards from ``LazyChunks``."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param

    original = _fsdp_param._chunk_with_empty

    def chunks(tensor: torch.Tensor, num_chunks: int, dim: int) -> Sequence[torch.Tensor]:
        if tensor.size(dim) == 0:
            return original(tensor, num_chunks, dim)
        return LazyChunks(tensor, num_chunks, dim)

    _fsdp_param._chunk_with_empty = chunks
    try:
        yield
    finally:
        _fsdp_param._chunk_with_empty = original
