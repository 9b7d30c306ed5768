"""Device memory of a step at any batch, from traces of the same step at other batches.

Why this works: the same step traced at another batch runs the same ops in the same order;
only tensor sizes change, and they are affine in the batch (activations grow with it, model
states do not). The allocator requests of a replay (``AllocationProgram``) are then the same
list with other byte counts, so replaying it with interpolated byte counts gives what the
replay of a real trace at that batch gives, the caching allocator's rounding, block reuse
and segment growth included, for a small fraction of the cost of a trace (a replay is
milliseconds, a trace of a 7B model seconds).

``search.fit`` uses it to propose the largest batch and to rule out the batches above it; the
answer and the batch after it are still traced. Peak memory is not monotone in the batch
(a slightly larger batch can fragment the cache less), so "the largest batch that fits" is
found by bisection to a boundary and then by replaying every batch above it up to a bound
that is monotone: the peak of the bytes requested, which no allocator can go below.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np

from nnperf.passes.memory.allocator import CachingAllocator
from nnperf.passes.memory.model import MARK, TAKE, AllocationProgram

#: Categories whose bytes grow with the batch; the rest (model states, weight casts,
#: workspaces, optimizer temporaries) do not. Used only for the one-trace first guess.
SCALING = frozenset({"inputs", "saved_activations", "forward_temporaries", "backward_temporaries"})


@dataclass(frozen=True, eq=False)
class Footprint:
    """What interpolation needs from one traced batch: its allocator requests in order, the
    convolution operands (the cuDNN workspace estimate) and the device terms that do not
    depend on sizes (the CUDA context)."""

    batch: int
    takes: tuple[bool, ...]  # per request: malloc (True) or free (False)
    keys: tuple[object, ...]  # per request: storage id or workspace key
    streams: tuple[Hashable, ...]  # per request: the stream it is made on (0: the compute stream)
    sizes: np.ndarray  # int64 bytes per request
    scaling: np.ndarray  # bool per request: of a category that grows with the batch
    conv: np.ndarray  # int64 bytes of every convolution operand
    fixed: int  # device terms besides the cuDNN estimate
    events: int  # ops in the trace (what a trace costs; a replay costs its requests)

    @classmethod
    def of(cls, batch: int, program: AllocationProgram, conv: list[int], fixed: int) -> Footprint:
        ops = [op for op in program.ops if op[0] != MARK]  # requests only
        marks = len(program.ops) - len(ops)  # one before the step, one per event and iteration
        return cls(
            batch=batch,
            takes=tuple(op[0] == TAKE for op in ops),
            keys=tuple(op[1] for op in ops),
            streams=tuple(program.streams.get(op[1], 0) for op in ops),
            sizes=np.array([op[2] for op in ops], dtype=np.int64),
            scaling=np.array([op[3] in SCALING for op in ops], dtype=bool),
            conv=np.array(conv, dtype=np.int64),
            fixed=int(fixed),
            events=(marks - 1) // 2,
        )

    def matches(self, other: Footprint) -> bool:
        """Whether ``other`` is the same step at another batch (same requests in order)."""
        return (
            len(self.keys) == len(other.keys)
            and len(self.conv) == len(other.conv)
            and self.fixed == other.fixed
            and self.takes == other.takes
            and self.streams == other.streams
            and self.keys == other.keys
        )


class BatchModel:
    """Device total as a function of the batch: ``sizes(b) = base + delta * (b - b0) // span``
    for every request, replayed through the allocator simulation."""

    def __init__(self, template: Footprint, b0: int, base: np.ndarray, delta: np.ndarray,
                 conv_base: np.ndarray, conv_delta: np.ndarray, span: int = 1):
        self.template = template
        self.b0, self.span = b0, span
        self.base, self.delta = base, delta
        self.conv_base, self.conv_delta = conv_base, conv_delta
        self._signs = np.where(np.array(template.takes, dtype=bool), 1, -1).astype(np.int64)
        self.replays = 0  # allocator replays run so far (what the search costs besides traces)
        self.requests = 0  # the allocator requests they replayed
        self.seconds = 0.0  # and the time they took

    @classmethod
    def between(cls, a: Footprint, c: Footprint) -> BatchModel:
        """Interpolation through two traced batches of the same step (``a.matches(c)``)."""
        if c.batch < a.batch:
            a, c = c, a
        return cls(a, a.batch, a.sizes, c.sizes - a.sizes, a.conv, c.conv - a.conv,
                   span=c.batch - a.batch)

    @classmethod
    def scaled(cls, one: Footprint) -> BatchModel:
        """A guess from one traced batch: requests of growing categories (and convolution
        operands) proportional to the batch, the rest constant."""
        per_batch = one.sizes // one.batch
        return cls(one, one.batch, one.sizes, np.where(one.scaling, per_batch, 0),
                   one.conv, one.conv // one.batch)

    @property
    def monotone(self) -> bool:
        """No request shrinks as the batch grows: the requested-bytes bound is monotone."""
        return bool((self.delta >= 0).all() and (self.conv_delta >= 0).all())

    def sizes(self, batch: int) -> np.ndarray:
        """Bytes of every request at ``batch`` (int64: a request is far below 2**63 bytes)."""
        return np.maximum(self.base + self.delta * (batch - self.b0) // self.span, 0)

    def _extra(self, batch: int) -> int:
        """Device terms outside the allocator: context plus the cuDNN workspace estimate."""
        if not len(self.conv_base):
            return self.template.fixed
        conv = np.maximum(self.conv_base + self.conv_delta * (batch - self.b0) // self.span, 0)
        return self.template.fixed + int(conv.max())

    def lower_bound(self, batch: int) -> int:
        """Peak bytes requested plus the outside terms: at most the device total whatever the
        allocator does (blocks are at least the requests, segments at least the blocks)."""
        sizes = self.sizes(batch)
        if not len(sizes):
            return self._extra(batch)
        if int(sizes.max()) * len(sizes) < 1 << 62:  # the running sum fits in int64
            peak = int(np.cumsum(sizes * self._signs).max())
        else:  # a huge batch of a huge model: Python integers do not overflow
            peak = max(itertools.accumulate(
                n if take else -n for take, n in zip(self.template.takes, sizes.tolist(),
                                                    strict=True)))
        return peak + self._extra(batch)

    def total(self, batch: int, capacity: int | None = None) -> int | None:
        """The device total at ``batch`` by replay; None as soon as it exceeds ``capacity``
        (segments are never returned, so reserved bytes only grow during a replay)."""
        start = time.perf_counter()
        try:
            return self._replay(batch, capacity)
        finally:
            self.replays += 1
            self.requests += len(self.template.keys)
            self.seconds += time.perf_counter() - start

    def _replay(self, batch: int, capacity: int | None) -> int | None:
        extra = self._extra(batch)
        budget = None if capacity is None else capacity - extra
        alloc = CachingAllocator()
        malloc, free = alloc.malloc, alloc.free
        for take, key, stream, nbytes in zip(self.template.takes, self.template.keys, self.template.streams,
                                             self.sizes(batch).tolist(), strict=True):
            if take:
                malloc(key, nbytes, stream)
                if budget is not None and alloc.reserved > budget:
                    return None
            else:
                free(key)
        return alloc.peak_reserved + extra

    def fits(self, batch: int, capacity: int) -> bool:
        return self.total(batch, capacity) is not None

    def limit(self, capacity: int, max_batch: int) -> int:
        """The largest batch in [1, max_batch] whose lower bound fits (0: none); every batch
        above it needs more than ``capacity``. Needs a ``monotone`` model."""
        if self.lower_bound(1) > capacity:
            return 0
        if self.lower_bound(max_batch) <= capacity:
            return max_batch
        lo, hi = 1, max_batch  # the bound fits at lo, not at hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.lower_bound(mid) <= capacity:
                lo = mid
            else:
                hi = mid
        return lo

    def largest(self, capacity: int, max_batch: int,
                max_requests: int | None = None) -> tuple[int, bool]:
        """The largest batch in [1, max_batch] that fits (0: none) and whether every batch
        above it was ruled out: a boundary by bisection, then a replay of every batch above
        it up to the monotone limit (exact, also where the peak is not monotone).

        A model whose limit lies far above its answer (a huge batch of a small model, the
        cache fragmented by a third) can need more replays than they are worth: past
        ``max_requests`` replayed requests the scan stops with the largest fitting batch it
        found, which the bisection and the scan up from it make the likeliest one. The budget
        counts requests, not seconds, so the answer does not depend on the machine's speed.
        """
        limit = self.limit(capacity, max_batch)
        if limit == 0:
            return 0, True
        best = self.boundary(capacity, limit)
        if not self.fits(best, capacity):
            best = 0
        start = self.requests
        for batch in range(best + 1, limit + 1):
            if max_requests is not None and self.requests - start > max_requests:
                return best, False
            if self.fits(batch, capacity):
                best = batch
        return best, True

    def boundary(self, capacity: int, max_batch: int) -> int:
        """A batch that fits with the next one not fitting, by bisection under the limit
        (a quick guess: it assumes the peak grows with the batch); at least 1."""
        lo, hi = 1, self.limit(capacity, max_batch) + 1
        if hi - 1 >= 1 and self.fits(hi - 1, capacity):
            return hi - 1
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.fits(mid, capacity):
                lo = mid
            else:
                hi = mid
        return lo
