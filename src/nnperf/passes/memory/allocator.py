"""A simulation of PyTorch's CUDA caching allocator, enough to predict "allocated" and "reserved".

Why simulate instead of summing tensor sizes: ``torch.cuda.max_memory_allocated`` counts
*blocks*, not tensors (every request is rounded to 512 bytes, and a cached block reused for a
slightly smaller request is counted whole), and ``max_memory_reserved`` counts *segments*
obtained from ``cudaMalloc``, which the allocator keeps after the tensors in them die. The
constants and rules below mirror ``c10/cuda/CUDACachingAllocator.cpp`` with default settings
(no ``PYTORCH_CUDA_ALLOC_CONF``): no expandable segments, no max_split_size, no garbage
collection threshold.

Rules modelled:
- a request is rounded up to a multiple of 512 bytes (``kMinBlockSize``);
- requests <= 1 MiB use the small pool, whose segments are 2 MiB; larger requests use the
  large pool, whose segments are 20 MiB for requests below 10 MiB and the request rounded up
  to 2 MiB beyond;
- a request takes the smallest cached free block of its pool that is large enough (best
  fit, lowest address on ties); the block is split when the remainder exceeds 512 bytes
  (small pool) or 1 MiB (large pool), otherwise the request gets the whole block;
- freed blocks merge with free neighbours of the same segment; segments are never returned
  to the driver (only ``empty_cache`` or an out-of-memory retry does that, not modelled);
- a segment belongs to the stream it was allocated for, and its blocks serve requests made on
  that stream only (``get_free_block`` searches the pool's blocks of the request's stream), so
  what a side stream allocates (FSDP2's all-gather and reduce-scatter buffers) is cached apart
  from the compute stream's.
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable
from dataclasses import dataclass

KB = 1024
MB = 1024 * KB
MIN_BLOCK = 512  # kMinBlockSize
SMALL_SIZE = 1 * MB  # kSmallSize: largest request served by the small pool
SMALL_BUFFER = 2 * MB  # kSmallBuffer: small-pool segment size
LARGE_BUFFER = 20 * MB  # kLargeBuffer: large-pool segment size for requests < MIN_LARGE_ALLOC
MIN_LARGE_ALLOC = 10 * MB  # kMinLargeAlloc
ROUND_LARGE = 2 * MB  # kRoundLarge: segments for big requests are rounded to this


def round_size(nbytes: int) -> int:
    """The block size the allocator hands out for a request (``round_size``)."""
    if nbytes < MIN_BLOCK:
        return MIN_BLOCK
    return MIN_BLOCK * ((nbytes + MIN_BLOCK - 1) // MIN_BLOCK)


def segment_size(nbytes: int) -> int:
    """The ``cudaMalloc`` size used when no cached block fits (``get_allocation_size``)."""
    if nbytes <= SMALL_SIZE:
        return SMALL_BUFFER
    if nbytes < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * ((nbytes + ROUND_LARGE - 1) // ROUND_LARGE)


@dataclass(slots=True)
class _Block:
    addr: int
    size: int
    segment: int
    small: bool
    stream: Hashable = 0
    free: bool = True
    prev: _Block | None = None
    next: _Block | None = None
    requested: int = 0  # bytes asked for by the request the block serves (while live)


class CachingAllocator:
    """Replays malloc/free requests; tracks allocated and reserved bytes and their peaks.

    ``malloc(key, nbytes)`` and ``free(key)`` take a caller-chosen key (a storage id), so a
    trace can be replayed without real addresses.

    Free blocks sit in one sorted list per pool and stream as ``(size, addr, block)``: no two free
    blocks share an address, so ordering never compares the blocks themselves, and a block
    is found again by bisecting on ``(size, addr)``. (``search.fit`` replays thousands of
    requests per batch it rules out, so these paths are kept lean.)
    """

    def __init__(self) -> None:
        self._free: dict[tuple[int, bool], list[tuple[int, int, _Block]]] = {}
        self._live: dict[object, _Block] = {}
        self._next_addr = 0
        self.segments = 0
        self.allocated = 0  # bytes of live blocks (what torch.cuda.memory_allocated reports)
        self.requested = 0  # bytes actually asked for by live requests
        self.reserved = 0  # bytes of all segments (torch.cuda.memory_reserved)
        self.peak_allocated = 0
        self.peak_reserved = 0

    # -- free lists -------------------------------------------------------------------------
    def _push_free(self, b: _Block) -> None:
        b.free = True
        bisect.insort(self._free.setdefault((b.stream, b.small), []), (b.size, b.addr, b))

    def _pop_free(self, b: _Block) -> None:
        pool = self._free[b.stream, b.small]
        del pool[bisect.bisect_left(pool, (b.size, b.addr))]
        b.free = False

    # -- requests ---------------------------------------------------------------------------
    def malloc(self, key: object, nbytes: int, stream: Hashable = 0) -> int:
        """Serve a request made on ``stream`` (0: the compute stream; else a side stream's key,
        ``fsdp_streams``' records); returns the block size charged to "allocated"."""
        if key in self._live:
            raise KeyError(f"allocation {key!r} is already live")
        size = MIN_BLOCK if nbytes < MIN_BLOCK else MIN_BLOCK * ((nbytes + MIN_BLOCK - 1) // MIN_BLOCK)
        small = size <= SMALL_SIZE
        pool = self._free.setdefault((stream, small), [])
        i = bisect.bisect_left(pool, (size,))
        if i < len(pool):
            block = pool.pop(i)[2]
            block.free = False
        else:
            seg = segment_size(size)
            block = _Block(addr=self._next_addr, size=seg, segment=self.segments, small=small,
                           stream=stream, free=False)
            self._next_addr += seg
            self.segments += 1
            self.reserved += seg
            if self.reserved > self.peak_reserved:
                self.peak_reserved = self.reserved
        remaining = block.size - size
        if (small and remaining >= MIN_BLOCK) or (not small and remaining > SMALL_SIZE):
            rest = _Block(addr=block.addr + size, size=remaining, segment=block.segment,
                          small=small, stream=stream, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            self._push_free(rest)
        block.requested = nbytes
        self._live[key] = block
        self.allocated += block.size
        self.requested += nbytes
        if self.allocated > self.peak_allocated:
            self.peak_allocated = self.allocated
        return block.size

    def free(self, key: object) -> None:
        block = self._live.pop(key)
        self.allocated -= block.size
        self.requested -= block.requested
        for neighbour in (block.prev, block.next):
            if neighbour is not None and neighbour.free:
                self._pop_free(neighbour)
                if neighbour is block.prev:
                    neighbour.size += block.size
                    neighbour.next = block.next
                    if block.next is not None:
                        block.next.prev = neighbour
                    block = neighbour
                else:
                    block.size += neighbour.size
                    block.next = neighbour.next
                    if neighbour.next is not None:
                        neighbour.next.prev = block
        self._push_free(block)

    def __contains__(self, key: object) -> bool:
        return key in self._live
