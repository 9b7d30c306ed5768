"""Which reads a kernel finds in L2 because a recent kernel touched the same data.

Eager PyTorch runs one kernel per op, each reading its inputs and writing its output through
the L2 cache. A tensor one kernel writes (or reads) and the next reads soon after is still
there when little other data passed through the cache in between: that read costs L2
bandwidth, not DRAM bandwidth. On a 72 MB L2 (RTX 4090) whole activations of a batch stay
resident from one elementwise op to the next; on a 6 MB L2 almost nothing does.

The test: a read hits when the bytes touched since that data was last touched, plus the
bytes read now, fit in the GPU's measured reuse capacity (``GPU.l2_reuse``: where a
microbenchmark's L2 bandwidth starts to fall, which includes the A100/H100 halves that
duplicate data). An op reads its inputs one after another (a foreach op its whole lists), so
an input's distance counts the inputs the op read before it. "Bytes touched since" counts
every read and write in between, repeats included, so it is an upper bound of the LRU stack
distance: the model never finds more in L2 than an LRU cache of that size would hold. Data
is a region of a storage (offset and extent): writing one slice of a buffer does not make the
rest of it recent. Writes always count as DRAM traffic (a dirty line is written back when it
leaves L2).
"""

from __future__ import annotations

from collections.abc import Sequence

from nnperf.passes.count import OpCount


def l2_read_hits(counts: Sequence[OpCount], capacity_bytes: float) -> dict[int, float]:
    """Bytes each op reads from L2 (by event index; ops without hits left out), capped by the
    bytes its cost formula says it reads (``bytes_in + bytes_weights``)."""
    touched = 0.0  # bytes moved by all kernels so far
    last_touch: dict[tuple[int, int, int], float] = {}  # region -> ``touched`` right after its last touch
    hits: dict[int, float] = {}
    for count in counts:
        if not count.bytes:  # no kernel moves data (an allocation, a host op)
            continue
        event = count.event
        found = 0.0
        for t in event.inputs:
            region = (t.storage, t.storage_offset, t.nbytes)
            since = last_touch.get(region)
            if since is not None and touched - since + t.nbytes <= capacity_bytes:
                found += t.nbytes
            touched += t.nbytes
            last_touch[region] = touched
        reads = count.bytes_in + count.bytes_weights
        if found and reads:
            hits[event.index] = min(found, reads)
        for t in event.outputs:
            touched += t.nbytes
            last_touch[(t.storage, t.storage_offset, t.nbytes)] = touched
    return hits
