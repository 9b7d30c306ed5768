"""The step with a communication stream beside the compute stream.

``passes.timing`` plays the eager timeline: the host issues ops in order, one device stream
runs the kernels. Distributed engines run their collectives on separate streams: DDP launches
a bucket's all-reduce as soon as its gradients are in it, FSDP2 copies parameters into its
all-gather buffer and gathers them on its own streams (so the next unit's all-gather runs
during this unit's compute: implicit forward prefetch, explicit backward prefetch) and
reduce-scatters gradients while backward goes on. This pass replays the host's issue times
and the kernel times of ``StepTime`` with two streams and the one dependency that matters:
an op waits until every tensor it reads has been produced, on whichever stream. A collective
that finishes after the compute needing it is *exposed*; the wait is charged to its kind.

A collective also slows the compute kernels it overlaps (``Contention``): its kernel holds
one SM per NCCL channel (the cluster tier's ``collective_ctas``), so a compute-bound kernel
beside it runs on the SMs left, and the bytes it moves pass through DRAM (each byte it sends
or receives read once and written once: twice its bus bandwidth), so a memory-bound kernel
beside it gets the bandwidth left. The overlapped part of a kernel runs that much slower,
whichever of the two started first.

Each process group has its own stream: ProcessGroupNCCL runs a communicator's collectives on
that communicator's stream, so collectives of one group run in issue order, and those of
different groups (an FSDP all-gather and an expert-parallel all-to-all, a tensor-parallel
reduce-scatter and a pipeline send) may run at once. An engine may issue collectives from side
streams of its own (``SideStream``), one for all its groups: such a collective also waits for
the work issued on its side stream before it. FSDP2's (``passes.fsdp_streams``): its copy into
the all-gather buffer (and, under mixed precision, its cast of the shards before it) on the
copy-in stream, its all-gathers of every group on the all-gather stream, its reduce-scatters
on the reduce-scatter stream, HSDP's all-reduces on the all-reduce stream.

When a collective starts: ProcessGroupNCCL records an event on the stream current at issue and
makes the communicator's stream wait for it (``syncStream`` in ProcessGroupNCCL.cpp), so a
collective issued from the compute stream starts only after every kernel issued there before
it, not when its buffer was last written: DDP's bucket all-reduce after the backward kernels
issued before its hook, a tensor-parallel all-reduce of an input gradient after the weight
gradient's GEMM that autograd ran first in the same node, ZeRO-1's broadcast after the update.
FSDP2's reduce-scatter stream waits for the compute stream explicitly (``foreach_reduce``), the
same rule. A side stream that waits for no compute kernel (``SideStream.waits_for_compute``:
FSDP2's copy-in, all-gather and all-reduce streams) starts its collectives when their inputs
are ready, under compute already placed (implicit forward and explicit backward prefetch).
Pipelined with a GEMM (``pipelined``): Transformer Engine's userbuffers overlap
(Megatron-LM's ``--tp-comm-overlap``) splits a sequence-parallel all-gather and the GEMM it
feeds, or a GEMM and the reduce-scatter it feeds, into chunks that overlap one another
(``_pair_with_gemms`` finds the pairs). An all-gather in ``n`` chunks (a ring exchange: the
first chunk is the rank's own) lets its GEMMs start when it starts and finish no earlier than
``G / n`` after the last chunk arrives (then a weight gradient's GEMM reading it, whole); a
reduce-scatter in ``n`` chunks starts once the first chunk of its GEMM is done (``G / n`` after
the GEMM starts; with one chunk, when the GEMM ends: Megatron-LM's reduce-scatter of an input
gradient beside the weight gradient's GEMM) and ends no earlier than ``C / n`` after the
GEMM's last chunk. torch's async tensor parallelism (``Execution.async_tp``) pipelines the same
way in one chunk per rank, its chunks copied between symmetric-memory buffers, and leaves the
sum of a reduce-scatter's partial chunks to the compute stream once the last has arrived
(``reduced_after``).

What is not modelled yet: wave quantization on the SMs left (a one-wave GEMM can need a second
wave), a GEMM's efficiency in chunks, the collective's own slowdown, two concurrent
collectives sharing a link (a kernel beside two runs at the slowdown of the one that started
first), and the host cost of the collectives.
"""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field

from nnperf.passes.timing import OpTime, StepTime
from nnperf.trace.events import Trace
from nnperf.vocab import Category

#: The ops that add a linear's input gradients together (q, k and v into one) on their way from
#: the GEMMs to the reduce-scatter pipelined with them (``_writer_gemm``).
_ACCUMULATE = frozenset({"aten.add", "aten.add_"})


#: The most of the SMs or of the DRAM bandwidth a collective is taken to hold, so a what-if with
#: a tiny GPU cannot stall compute altogether.
MAX_SHARE = 0.9


@dataclass(frozen=True)
class SideStream:
    """A stream an engine issues its own kernels and collectives from, whatever their process
    group (FSDP2's ``FSDPCommContext`` streams): what runs there runs in issue order.
    ``waits_for_compute``: the engine makes it wait for the compute stream before each use."""

    name: str
    waits_for_compute: bool


@dataclass(frozen=True)
class Contention:
    """What a collective takes from the compute kernels beside it: a share of the SMs (its
    thread blocks) and a share of the DRAM bandwidth (the bytes it moves)."""

    sm_share: float
    dram_share: float

    def slowdown(self, t: OpTime) -> float:
        """How many times longer ``t``'s kernel runs beside the collective: its compute term on
        the SMs left, its memory term on the bandwidth left, launch overhead unchanged."""
        alone = max(t.model_compute_s, t.model_memory_s) + t.overhead_s
        if alone <= 0:
            return 1.0
        sm, dram = min(self.sm_share, MAX_SHARE), min(self.dram_share, MAX_SHARE)
        beside = max(t.model_compute_s / (1 - sm), t.model_memory_s / (1 - dram)) + t.overhead_s
        return beside / alone


@dataclass(frozen=True)
class CommSlice:
    index: int
    kind: str
    bytes: int
    start_s: float
    end_s: float


@dataclass
class CommStep:
    step_s: float
    compute_s: float  # kernel time on the compute stream
    comm_s: float  # collective time on the communication stream
    exposed_s: dict[str, float] = field(default_factory=dict)  # collective kind -> compute waited
    slices: list[CommSlice] = field(default_factory=list)
    #: compute time added by collectives running beside kernels (``Contention``)
    slowdown_s: float = 0.0
    #: event index -> when the compute stream is done with everything up to that event (its
    #: clock: an action's time in a pipeline schedule is the difference across its events)
    clock: dict[int, float] = field(default_factory=dict)
    #: each wait of the compute stream for a collective: (the waiting op's event index, the
    #: collective's event index, seconds), so a wait can be told apart by its collective
    waits: list[tuple[int, int, float]] = field(default_factory=list)
    #: each stretch of a kernel by a collective beside it: (the kernel's event index, the
    #: collective's event index, seconds added), summing to ``slowdown_s``
    slowed: list[tuple[int, int, float]] = field(default_factory=list)

    @property
    def exposed_total_s(self) -> float:
        return sum(self.exposed_s.values())


class _Busy:
    """The collectives in start order (those of several streams can overlap one another), with
    what each takes from compute."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.contention: list[Contention] = []
        self.indices: list[int] = []  # each collective's event index
        #: the latest end among the collectives up to each position: the first position whose
        #: running end lies after a time is the first that can still be running then
        self.reach: list[float] = []

    def add(self, start: float, end: float, contention: Contention, index: int) -> None:
        at = bisect.bisect_right(self.starts, start)
        self.starts.insert(at, start)
        self.ends.insert(at, end)
        self.contention.insert(at, contention)
        self.indices.insert(at, index)
        self.reach.insert(at, 0.0)
        for i in range(at, len(self.reach)):
            self.reach[i] = max(self.reach[i - 1] if i else 0.0, self.ends[i])

    def finish(self, start: float, t: OpTime) -> tuple[float, list[tuple[int, float]]]:
        """When ``t``'s kernel, started at ``start``, ends: ``t.kernel_s`` of work, done
        ``slowdown`` times slower while a collective runs (while two run, at the slowdown of
        the one that started first); and what each collective added to it (its event index,
        seconds)."""
        now, left = start, t.kernel_s
        added: list[tuple[int, float]] = []
        for i in range(bisect.bisect_right(self.reach, start), len(self.starts)):
            if self.ends[i] <= now:  # over before the kernel got here (another stream's)
                continue
            if self.starts[i] > now:  # a gap without communication first
                if left <= self.starts[i] - now:
                    break
                left -= self.starts[i] - now
                now = self.starts[i]
            k = self.contention[i].slowdown(t)
            if left * k <= self.ends[i] - now:
                added.append((self.indices[i], left * (k - 1)))
                return now + left * k, added
            beside = self.ends[i] - now
            added.append((self.indices[i], beside - beside / k))
            left -= beside / k
            now = self.ends[i]
        return now + left, added


def overlap(
    step: StepTime, trace: Trace, collective_time: Callable[[int], tuple[str, int, float]],
    contention: Callable[[int], Contention | None] | None = None,
    stream_of: Callable[[int], Hashable] | None = None,
    pipelined: Callable[[int], int | None] | None = None,
    side_streams: Mapping[int, SideStream] | None = None,
    event_waits: Mapping[int, int] | None = None,
    reduced_after: Callable[[int], float] | None = None,
) -> CommStep:
    """Replay ``step`` with collectives on their own streams. ``collective_time(index)`` gives
    the kind, bytes and time of the collective at that event index; ``contention(index)`` what
    it takes from compute kernels beside it (None, or no function: nothing); ``stream_of(index)``
    its stream, its process group (None, or no function: one stream for all); ``pipelined(index)``
    the chunks an all-gather or reduce-scatter runs in with its GEMM (None: not pipelined; the
    module docstring); ``side_streams`` the engine's side stream of each kernel and collective
    issued from one (``fsdp_streams.engine_streams``): a kernel there runs beside compute;
    ``event_waits`` an earlier op an op waits to end, whatever the streams (an engine's
    ``wait_event`` on the event recorded after it: ``fsdp_streams.engine_waits``);
    ``reduced_after(index)`` the seconds of the sum a pipelined reduce-scatter leaves to the
    compute stream (None, or no function: none, as NCCL reduces while it moves the chunks; torch's
    async tensor parallelism copies the ranks' partial chunks and the compute stream, once the
    last has arrived, sums them: ``_fused_matmul_reduce_scatter_impl``'s ``reduce_fn``; its
    chunks go by copy engine, so ``contention`` takes no SM for them)."""
    side_streams = side_streams or {}
    event_waits = event_waits or {}
    ends: dict[int, tuple[float, str | None]] = {}  # op index -> (end, its kind if a collective)
    issued = {s.index: s.end_s for s in step.host_slices}
    pairs = _pair_with_gemms(step, collective_time, pipelined) if pipelined is not None else {}
    spans: dict[int, tuple[float, float]] = {}  # a paired GEMM's event index -> (start, end)
    gathering: dict[int, int] = {}  # storage -> the pipelined all-gather it comes from
    gathered: dict[int, tuple[_Pair, CommSlice]] = {}  # a pipelined all-gather's index -> it
    produced: dict[int, tuple[float, str | None, int | None]] = {}  # storage -> (ready, kind, collective) if comm
    compute_free = compute_busy = comm_busy = slowdown = 0.0
    streams = {t.index: stream_of(t.index) for t in step.ops
               if stream_of is not None and t.category == Category.COMMUNICATION}
    comm_free: dict[Hashable, float] = defaultdict(float)
    exposed: dict[str, float] = defaultdict(float)
    slices: list[CommSlice] = []
    clock: dict[int, float] = {}
    waits: list[tuple[int, int, float]] = []
    slowed: list[tuple[int, int, float]] = []
    busy = _Busy()
    last: OpTime | None = None  # the compute stream's latest kernel
    for t in step.ops:
        clock[t.index] = compute_free
        event = t.count.event
        issue = issued.get(t.index, 0.0)
        ready, waited_on, waited_index = 0.0, None, None
        for m in event.inputs:
            when, kind, index = produced.get(m.storage, (0.0, None, None))
            if when > ready:
                ready, waited_on, waited_index = when, kind, index
        if t.index in event_waits and event_waits[t.index] in ends:
            when, kind = ends[event_waits[t.index]]
            if when > ready:
                ready, waited_on, waited_index = when, kind, event_waits[t.index] if kind else None
        if t.category == Category.COMMUNICATION:
            kind, nbytes, seconds = collective_time(t.index)
            stream = streams.get(t.index)
            side = side_streams.get(t.index)
            if side is None or side.waits_for_compute:
                # issued from the compute stream, or a side stream that waits for it:
                # ProcessGroupNCCL's stream waits for every kernel issued there before it (the
                # module docstring)
                ready = max(ready, compute_free)
            if side is not None:  # and for what its side stream was given before it
                ready = max(ready, comm_free[side])
            pair = pairs.get(t.index)
            if pair is not None and pair.scatters and pair.gemms[0] in spans:
                # its chunks follow the GEMM's: the first once the GEMM's first chunk is done, the
                # last after the GEMM's last (what moves or adds its output on the way is this
                # trace's, not Transformer Engine's, which writes into the collective's buffer)
                gemm_start, gemm_end = spans[pair.gemms[0]]
                start = max(issue, comm_free[stream], gemm_start + (gemm_end - gemm_start) / pair.chunks)
                end = max(start + seconds, gemm_end + seconds / pair.chunks)
            else:
                start = max(issue, comm_free[stream], ready)
                end = start + seconds
            comm_free[stream] = end
            if side is not None:
                comm_free[side] = end
            ends[t.index] = (end, kind)
            comm_busy += seconds
            slices.append(CommSlice(t.index, kind, nbytes, start, end))
            for m in event.inputs + event.outputs:
                produced[m.storage] = (end, kind, t.index)
            if pair is not None and not pair.scatters:
                # its GEMMs start on the first chunk, the rank's own (and end after the last: below)
                gathered[t.index] = (pair, slices[-1])
                for m in event.outputs:
                    produced[m.storage] = (start, kind, t.index)
                    gathering[m.storage] = t.index
            taken = contention(t.index) if contention is not None and seconds > 0 else None
            if taken is not None:
                busy.add(start, end, taken, t.index)
                if last is not None and start < compute_free:
                    # it began under compute already placed: the rest of that work (from its
                    # start on, at the latest kernel's slowdown) runs slower while it lasts
                    k = taken.slowdown(last)
                    extra = min((compute_free - start) * (k - 1), seconds * (1 - 1 / k))
                    compute_free += extra
                    compute_busy += extra
                    slowdown += extra
                    slowed.append((last.index, t.index, extra))
                    clock[last.index] = compute_free
            if pair is not None and pair.scatters and reduced_after is not None:
                summed_s = reduced_after(t.index)
                compute_free = _summed_after(compute_free, issue, end, summed_s, kind, t.index, exposed, waits)
                compute_busy += summed_s
                for m in event.outputs:
                    produced[m.storage] = (compute_free, None, None)
            continue
        source = next((gathering[m.storage] for m in event.inputs if m.storage in gathering), None)
        if source is not None and t.index not in gathered[source][0].gemms and not _moves(t):
            # a reader that is not pipelined with it waits for the whole of it
            gather = gathered[source][1]
            if gather.end_s > ready:
                ready, waited_on, waited_index = gather.end_s, gather.kind, source
            source = None
        if not t.kernels:
            # no kernel (a functional collective's stream wait, an allocation): what it
            # returns is ready when what it reads is, so a reader still waits for the collective
            for m in event.outputs:
                if ready > produced.get(m.storage, (0.0, None, None))[0]:
                    produced[m.storage] = (ready, waited_on, waited_index)
                if source is not None:
                    gathering[m.storage] = source
            continue
        if t.index in side_streams:
            side = side_streams[t.index]
            start = max(issue, comm_free[side], ready, compute_free if side.waits_for_compute else 0.0)
            end = comm_free[side] = start + t.kernel_s
            ends[t.index] = (end, None)
            comm_busy += t.kernel_s
        else:
            free = max(issue, compute_free)
            start = max(free, ready)
            if start > free and waited_on is not None:
                exposed[waited_on] += start - free
                if waited_index is not None:
                    waits.append((t.index, waited_index, start - free))
            compute_free, added = busy.finish(start, t)
            end = compute_free
            compute_busy += end - start
            slowdown += end - start - t.kernel_s
            slowed.extend((t.index, index, seconds) for index, seconds in added)
            if source is not None and t.index in gathered[source][0].gemms:  # one of the GEMMs it feeds
                pair, gather = gathered[source]
                if t.index == pair.gemms[-1]:
                    # the GEMMs' last chunk runs after the all-gather's last chunk arrives
                    floor = gather.end_s + pair.after_s
                    if floor > end:
                        exposed[gather.kind] += floor - end
                        waits.append((t.index, source, floor - end))
                        end = compute_free = floor
                source = None  # what the GEMM writes is its own
            spans[t.index] = (start, end)
            ends[t.index] = (end, None)
            clock[t.index] = compute_free
            last = t
        for m in event.outputs:
            produced[m.storage] = (end, None, None)
            if source is not None:  # moved on its way to the GEMM (DTensor's cat)
                gathering[m.storage] = source
    comm_end = max(comm_free.values(), default=0.0)
    if comm_end > compute_free:  # the step ends when the last collective does
        last = max(slices, key=lambda c: c.end_s).kind if slices else "communication"
        exposed[last] += max(0.0, comm_end - max(compute_free, step.host_s))
    end = max(compute_free, comm_end, step.host_s)
    return CommStep(end, compute_busy, comm_busy, {k: v for k, v in exposed.items() if v > 0}, slices,
                    slowdown_s=slowdown, clock=clock, waits=waits, slowed=slowed)


@dataclass(frozen=True)
class _Pair:
    """A collective pipelined with a GEMM: the GEMMs it feeds (an all-gather: those that take
    what it gathers, as one GEMM, the way Transformer Engine's fused q-k-v and gate-up linears
    take it) or the GEMM whose output it reduces (a reduce-scatter), and the chunks they run in."""

    gemms: tuple[int, ...]  # the GEMMs' event indices, in order
    #: an all-gather's: how long after its last chunk arrives its GEMMs can be done at the
    #: earliest: the pipelined GEMMs' last chunk, then whole any weight gradient's GEMM reading
    #: it (Transformer Engine runs that after the input gradient's, on the whole gathered tensor)
    after_s: float
    chunks: int
    scatters: bool  # a reduce-scatter after its GEMM; else an all-gather before them


def _summed_after(compute_free: float, issue: float, end: float, summed_s: float, kind: str, index: int,
                  exposed: dict[str, float], waits: list[tuple[int, int, float]]) -> float:
    """The compute stream's clock after a pipelined reduce-scatter whose partial chunks it sums
    itself (``overlap``'s ``reduced_after``): issued with the collective, the sum waits for the
    last chunk, its wait counted exposed (``exposed``, ``waits``), then runs ``summed_s``."""
    free = max(issue, compute_free)
    if end > free:
        exposed[kind] += end - free
        waits.append((index, index, end - free))
    return max(free, end) + summed_s


def _pair_with_gemms(step: StepTime, collective_time: Callable[[int], tuple[str, int, float]],
                     pipelined: Callable[[int], int | None]) -> dict[int, _Pair]:
    """Each pipelined collective's GEMMs. An all-gather's are the GEMMs reading what it gathered
    (through ops that only move it) before the next collective, the first of them the first
    kernel after it: Transformer Engine's ring exchange feeds the GEMM right after the gather, so
    a gather with other work first (Megatron-LM's regathered input, waited for later) is already
    overlapped and stays as it is. A reduce-scatter's is the latest GEMM that wrote what it
    reduces, through ops that move it or add input gradients together; other GEMMs between them
    (the weight gradients autograd runs in the same node) run beside it."""
    ops = step.ops
    pairs: dict[int, _Pair] = {}
    for at, t in enumerate(ops):
        if t.category != Category.COMMUNICATION:
            continue
        chunks = pipelined(t.index)
        kind = collective_time(t.index)[0] if chunks else ""
        if kind == "all_gather":
            gemms = _reader_gemms(ops, at)
        elif kind == "reduce_scatter":
            gemms = _writer_gemm(ops, at)
        else:
            continue
        if gemms:
            after = sum(u.kernel_s / (1 if _weight_gradient(u) else chunks) for u in gemms)
            pairs[t.index] = _Pair(tuple(u.index for u in gemms), after, chunks, kind == "reduce_scatter")
    return pairs


def _moves(t: OpTime) -> bool:
    """An op that only moves or views data (no kernel, or a copy)."""
    return not t.kernels or t.category == Category.MEMORY


def _weight_gradient(t: OpTime) -> bool:
    return any(g.gemm.role == "grad_weight" for g in t.gemms)


def _reader_gemms(ops: list[OpTime], at: int) -> tuple[OpTime, ...]:
    """The GEMMs that take what the all-gather at ``at`` gathers, as one GEMM: none unless the
    first kernel after it that is not a move is one of them; up to the next collective or the
    first kernel reading what one of them wrote (SwiGLU's activation between the zoo's gate and
    up projections, which Transformer Engine's fused GEMM has before it: the GEMMs after it
    wait for the whole gathered tensor)."""
    lineage = {m.storage for m in ops[at].count.event.outputs}
    gemms: list[OpTime] = []
    written: set[int] = set()
    for t in itertools.islice(ops, at + 1, None):
        if t.category == Category.COMMUNICATION:
            break
        event = t.count.event
        reads = any(m.storage in lineage for m in event.inputs)
        if any(m.storage in written for m in event.inputs):
            if t.kernels:
                break
            written.update(m.storage for m in event.outputs)  # a view of a GEMM's output
            continue
        if reads and t.category == Category.GEMM:
            gemms.append(t)
            written.update(m.storage for m in event.outputs)
        elif reads and _moves(t):
            lineage.update(m.storage for m in event.outputs)
        elif t.kernels and not gemms:
            return ()  # other work first (or a reader that is not a GEMM)
    return tuple(gemms)


def _writer_gemm(ops: list[OpTime], at: int) -> tuple[OpTime, ...]:
    """The latest GEMM that wrote what the reduce-scatter at ``at`` reduces (none if something
    else computed it)."""
    wanted = {m.storage for m in ops[at].count.event.inputs}
    for t in map(ops.__getitem__, range(at - 1, -1, -1)):
        event = t.count.event
        if not any(m.storage in wanted for m in event.outputs):
            continue
        if t.category == Category.GEMM:
            return (t,)
        if _moves(t) or (t.category == Category.ELEMENTWISE and event.name in _ACCUMULATE):
            wanted.update(m.storage for m in event.inputs)
        else:
            return ()
    return ()

