"""Predict peak device memory of a traced step by replaying its tensor lifetimes.

The trace already says when every storage is created (``OpEvent.allocates``) and when the
last reference to it died (``OpEvent.releases``), including autograd freeing saved tensors
during backward. Replaying those requests through the caching-allocator simulation gives
"allocated" and "reserved" as PyTorch reports them; device-level terms (context, cuDNN
workspace) are added separately and labeled.

Two iterations are replayed, like a measurement after a few steps would see them: the first
creates the optimizer state lazily inside the optimizer step (what PyTorch does on step 1,
which decides how segments fragment), the second is the steady state the trace recorded.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from nnperf.passes.fsdp_streams import (
    COPY_IN_STREAM,
    COPY_OUT,
    REDUCE_SCATTER_STREAM,
    engine_streams,
    implicit_copy_ins,
)
from nnperf.passes.memory import device as device_terms
from nnperf.passes.memory.allocator import CachingAllocator
from nnperf.passes.memory.report import CATEGORIES, MemoryReport, TimelinePoint
from nnperf.trace.collectives import COLLECTIVES
from nnperf.trace.events import Trace
from nnperf.vocab import MemoryCategory as Mem
from nnperf.vocab import Phase, StorageKind

#: Timelines longer than this are down-sampled (keeping each bucket's maximum and the peak).
MAX_TIMELINE_POINTS = 2000

_KIND_CATEGORY = {
    StorageKind.PARAMETER: Mem.PARAMETERS,
    StorageKind.BUFFER: Mem.BUFFERS,
    StorageKind.INPUT: Mem.INPUTS,
    StorageKind.GRADIENT: Mem.GRADIENTS,
    StorageKind.OPTIMIZER_STATE: Mem.OPTIMIZER_STATE,
}
_PERSISTENT = {Mem.PARAMETERS, Mem.BUFFERS, Mem.INPUTS, Mem.OPTIMIZER_STATE}
_CAST_OPS = {"aten._to_copy", "aten.to", "aten._autocast_to_reduced_precision"}
_HOST_SCALAR_OPS = {"aten.lift_fresh", "aten.lift_fresh_copy", "aten.scalar_tensor"}


@dataclass(frozen=True)
class StorageRole:
    """Where a storage lives and which breakdown category it belongs to."""

    on_device: bool
    category: Mem
    module: str


def classify(trace: Trace, optimizer_impl: str | None = None,
             releases: dict[int, int | None] | None = None) -> dict[int, StorageRole]:
    """Decide, for every storage of the trace, whether it is on the GPU and what it is
    (``releases``: see ``allocation_program``; a storage released in forward is no saved
    activation).

    Everything is on the CPU fake device in the trace, so host-resident tensors of a real GPU
    run are recognized by rule: the 0-dim ``step`` counters of non-fused optimizers and 0-dim
    constants created in the optimizer or lifted from Python scalars stay on the host.
    """
    impl = optimizer_impl or trace.config.get("options", {}).get("optimizer_impl", "foreach")
    ndim: dict[int, int] = {}
    for e in trace.events:
        for m in (*e.inputs, *e.outputs):
            ndim.setdefault(m.storage, len(m.shape))
    last_forward = max((e.index for e in trace.events if e.phase == Phase.FORWARD), default=-1)
    params = set(trace.param_storages)
    gathered = unsharded_parameters(trace)
    roles: dict[int, StorageRole] = {}
    for sid, info in trace.storages.items():
        scalar = ndim.get(sid, 1) == 0
        creator = trace.events[info.created_by] if info.created_by is not None else None
        module = creator.module if creator is not None else ""
        if info.kind == StorageKind.UNHELD_GRADIENT:  # timed, not held: no device bytes
            roles[sid] = StorageRole(False, Mem.GRADIENTS, module)
            continue
        if info.kind in _KIND_CATEGORY:
            cat = _KIND_CATEGORY[info.kind]
            host = info.kind == StorageKind.OPTIMIZER_STATE and scalar and impl != "fused"
            roles[sid] = StorageRole(not host, cat, module)
            continue
        # activations and other storages created during the step
        if creator is None:
            roles[sid] = StorageRole(not scalar, Mem.BUFFERS, module)
            continue
        if scalar and (creator.phase == Phase.OPTIMIZER or creator.name in _HOST_SCALAR_OPS):
            roles[sid] = StorageRole(False, Mem.OPTIMIZER_TEMPORARIES, module)
            continue
        if creator.phase == Phase.FORWARD:
            from_param = creator.name in _CAST_OPS and any(m.storage in params for m in creator.inputs)
            if from_param or sid in gathered:
                cat = Mem.AMP_WEIGHT_CASTS
            elif trace.mode == "train" and (
                (released := releases.get(sid, info.released_after) if releases else info.released_after) is None
                or released > last_forward
            ):
                cat = Mem.SAVED_ACTIVATIONS
            else:
                cat = Mem.FORWARD_TEMPORARIES
        elif creator.phase == Phase.BACKWARD:
            cat = Mem.BACKWARD_TEMPORARIES
        else:
            cat = Mem.OPTIMIZER_TEMPORARIES
        roles[sid] = StorageRole(True, cat, module)
    assert all(r.category in CATEGORIES for r in roles.values())
    return roles


def unsharded_parameters(trace: Trace) -> set[int]:
    """Storages FSDP2 gathers its parameters into (the outputs of its unshard copy). They are
    weight copies, not activations: kept from forward into backward when the module does not
    reshard after forward (always its root), they are held once per rank whatever the
    micro-batches in flight, and do not grow with the batch (issue 18: counted as saved
    activations, a pipeline stage multiplied them by its in-flight micro-batches)."""
    return {m.storage for e in trace.events if e.name == COPY_OUT for m in e.inputs[1:]}


#: Allocation program op codes (see ``AllocationProgram``).
TAKE, GIVE, MARK = 0, 1, 2


@dataclass
class AllocationProgram:
    """The allocator requests replaying a trace makes, in order, with every condition of the
    replay (is this storage on the device, is it already live) resolved once.

    ``ops`` holds ``(TAKE, key, nbytes, category)`` and ``(GIVE, key, nbytes, category)``
    requests and ``(MARK, event, recording, "")`` after each event's allocations (``event`` is
    None for the state before the first step). The requests depend on the trace's order of
    events and storage lifetimes but not on the sizes, so two traces of the same step at
    different batches give the same program up to ``nbytes`` (what ``search.fit`` uses to
    interpolate between traced batches), and replaying only for peaks skips the bookkeeping.
    """

    ops: list[tuple[int, Any, int, str]]
    roles: dict[int, StorageRole]  # the classification the program was built from
    #: the stream a request is made on, where not the compute stream's (``side_streams``)
    streams: dict[Any, Hashable] = field(default_factory=dict)

    def peaks(self) -> tuple[int, int]:
        """(peak allocated, peak reserved) of a replay, without breakdown or timeline."""
        alloc = CachingAllocator()
        malloc, free, streams = alloc.malloc, alloc.free, self.streams
        for code, key, nbytes, _ in self.ops:
            if code == TAKE:
                malloc(key, nbytes, streams.get(key, 0))
            elif code == GIVE:
                free(key)
        return alloc.peak_allocated, alloc.peak_reserved


def allocation_program(
    trace: Trace, roles: dict[int, StorageRole] | None = None, architecture: str | None = None,
    releases: dict[int, int | None] | None = None,
) -> AllocationProgram:
    """The requests of a two-iteration replay of ``trace`` (see the module docstring).
    ``releases``: storages released after another event than the trace's (None: kept past the
    step), as fused pointwise kernels keep them (``passes.memory.fused``; worked out here for a
    trace with fused blocks when not given)."""
    if releases is None and trace.config.get("fused_blocks"):
        from nnperf.passes.count import count_ops
        from nnperf.passes.memory.fused import fused_releases

        releases = fused_releases(trace, count_ops(trace))
    roles = classify(trace, releases=releases) if roles is None else roles
    releases = releases or {}
    released_at: dict[int, list[int]] = defaultdict(list)
    for sid, index in releases.items():
        if index is not None:
            released_at[index].append(sid)
    options = trace.config.get("options", {})
    storages = trace.storages
    ops: list[tuple[int, Any, int, str]] = []
    live: set[Any] = set()

    def take(key: Any, nbytes: int, category: str) -> None:
        ops.append((TAKE, key, nbytes, category))
        live.add(key)

    def give(key: Any, nbytes: int, category: str) -> None:
        if key in live:
            ops.append((GIVE, key, nbytes, category))
            live.discard(key)

    device = {s: r for s, r in roles.items() if r.on_device}
    # The model and the batch are on the device before the first step; optimizer state is
    # created inside the first optimizer step (replayed lazily below).
    lazy_state = [s for s, r in device.items()
                  if storages[s].created_by is None and r.category == Mem.OPTIMIZER_STATE]
    for sid, role in device.items():
        info = storages[sid]
        if info.created_by is None and role.category != Mem.OPTIMIZER_STATE:
            take(sid, info.nbytes, role.category)
    ops.append((MARK, None, False, ""))

    ws_size = device_terms.cublas_workspace_bytes(architecture)
    persistent = {s for s, r in device.items() if r.category in _PERSISTENT}
    if options.get("grads_persist"):
        persistent |= {s for s, r in device.items() if r.category == Mem.GRADIENTS}
    # gradients that were there before the step are views of a buffer another owner keeps (DDP's
    # buckets with gradient_as_bucket_view, ZeRO-1's): zero_grad drops the views, not the buffer
    persistent |= {s for s, r in device.items() if r.category == Mem.GRADIENTS and storages[s].created_by is None}
    cublas = [e.name in device_terms.CUBLAS_OPS for e in trace.events]
    for iteration in (1, 2):
        recording = iteration == 2
        state_pending = iteration == 1 and bool(lazy_state)
        for e, uses_cublas in zip(trace.events, cublas, strict=True):
            if state_pending and e.phase == Phase.OPTIMIZER:
                for sid in lazy_state:
                    take(sid, storages[sid].nbytes, Mem.OPTIMIZER_STATE)
                state_pending = False
            if uses_cublas:
                key = ("cublas_workspace", "backward" if e.phase == Phase.BACKWARD else "main")
                if key not in live:
                    take(key, ws_size, Mem.WORKSPACES)
            for sid in e.allocates:
                role = device.get(sid)
                if role is not None and sid not in live:
                    take(sid, storages[sid].nbytes, role.category)
            ops.append((MARK, e, recording, ""))
            # Frees of one event commute (the allocator merges free neighbours whatever the
            # order); sorting them makes the program independent of the order in which
            # Python happened to finalize the storages.
            for sid in sorted({*(s for s in e.releases if s not in releases), *released_at.get(e.index, ())}):
                role = device.get(sid)
                if role is not None:
                    give(sid, storages[sid].nbytes, role.category)
        if state_pending:  # a trace with state but no optimizer events: keep it allocated
            for sid in lazy_state:
                take(sid, storages[sid].nbytes, Mem.OPTIMIZER_STATE)
        # end of the step: the loop drops outputs and loss; zero_grad(set_to_none) drops grads
        for sid, role in device.items():
            if sid not in persistent:
                give(sid, storages[sid].nbytes, role.category)
    return AllocationProgram(ops, roles, side_streams(trace))


def side_streams(trace: Trace) -> dict[int, Hashable]:
    """Storages FSDP2 allocates on its side streams, which the caching allocator keeps apart
    from the compute stream's (``allocator``): its all-gather buffers and the low-precision
    copies of the shards gathered into them (``foreach_all_gather`` runs
    ``fsdp.all_gather_copy_in`` on the all-gather copy-in stream in forward and pre-backward),
    and each reduce-scatter's output (``foreach_reduce`` allocates it on the reduce-scatter
    stream; its input, which ``fsdp.chunk_cat`` fills, on the compute stream), which the
    sharded gradients are views of. Not the gathers torch's pipeline runtime asks for itself
    (its ``UNSHARD`` actions, between the schedule's forwards and backwards): it calls
    ``unshard(async_op=True)``, which gathers on the current stream
    (``FSDPCommContext.get_all_gather_streams``). The streams are ``passes.fsdp_streams``'."""
    streams: dict[int, Hashable] = {}
    for e in implicit_copy_ins(trace):
        for m in (*e.inputs, *e.outputs):
            if trace.storages[m.storage].created_by is not None:
                streams[m.storage] = COPY_IN_STREAM
    for index, stream in engine_streams(trace).items():
        event = trace.events[index]
        if stream is not REDUCE_SCATTER_STREAM or COLLECTIVES.get(event.name, ("",))[0] != "reduce_scatter":
            continue
        output = event.inputs[0].storage  # a reduce-scatter's first argument
        if trace.storages[output].created_by is not None:
            streams[output] = REDUCE_SCATTER_STREAM
    return streams


def predict_memory(
    trace: Trace,
    *,
    model: str = "model",
    architecture: str | None = None,
    context_mib: float | None = None,
    max_points: int = MAX_TIMELINE_POINTS,
    program: AllocationProgram | None = None,
    releases: dict[int, int | None] | None = None,
) -> MemoryReport:
    """Replay ``trace`` through the allocator simulation and report peaks and breakdown.

    ``program``: the trace's ``allocation_program`` for ``architecture`` when the caller has
    already built it (``search.fit`` keeps it to interpolate between batches); ``releases``:
    see ``allocation_program``.
    """
    if program is None:
        program = allocation_program(trace, None, architecture, releases)
    roles = program.roles
    alloc = CachingAllocator()
    live_by_cat: dict[str, int] = defaultdict(int)
    best: dict[str, object] = {"allocated": -1}
    timeline: list[tuple[int, str, str, int, int]] = []
    streams = program.streams
    for code, key, nbytes, category in program.ops:
        if code == TAKE:
            alloc.malloc(key, nbytes, streams.get(key, 0))
            live_by_cat[category] += nbytes
        elif code == GIVE:
            alloc.free(key)
            live_by_cat[category] -= nbytes
        else:
            e = key
            if alloc.allocated > best["allocated"]:
                best.update(allocated=alloc.allocated, requested=alloc.requested,
                            event=None if e is None else e.index,
                            phase=None if e is None else e.phase,
                            module=None if e is None else e.module, breakdown=dict(live_by_cat))
            if nbytes:  # recording
                timeline.append((e.index, e.phase, e.module, alloc.allocated, alloc.reserved))

    report = MemoryReport(source="predicted", model=model)
    report.peak_allocated = alloc.peak_allocated
    report.peak_reserved = alloc.peak_reserved
    report.peak_requested = int(best["requested"])  # type: ignore[arg-type]
    report.peak_event = best["event"]  # type: ignore[assignment]
    report.peak_phase = best["phase"]  # type: ignore[assignment]
    report.peak_module = best["module"]  # type: ignore[assignment]
    breakdown: dict[str, int] = best["breakdown"]  # type: ignore[assignment]
    report.breakdown = {c: int(breakdown.get(c, 0)) for c in CATEGORIES}
    report.breakdown["allocator_rounding"] = alloc.peak_allocated - sum(breakdown.values())
    report.saved_activations = saved_activations_by_module(trace, roles)
    report.model_states = model_states(trace, roles)
    terms = {"CUDA context (estimate per architecture)": device_terms.context_bytes(architecture, context_mib)}
    cudnn = cudnn_workspace_estimate(trace)
    if cudnn:
        terms["cuDNN workspace (estimate: largest convolution operand)"] = cudnn
    report.device_terms = terms
    report.device_total = alloc.peak_reserved + sum(terms.values())
    report.timeline_events = len(timeline)
    report.timeline = [TimelinePoint(*p) for p in downsample(timeline, max_points)]
    report.notes = [
        f"allocator simulation: {alloc.segments} segments, default PyTorch CUDA allocator "
        "settings (no expandable segments)",
        "cuBLAS workspaces are inside 'allocated' (they go through the caching allocator)",
    ]
    return report


def saved_activations_by_module(trace: Trace, roles: dict[int, StorageRole]) -> dict[str, int]:
    """Bytes created in forward and still alive when backward starts, per creating module."""
    out: dict[str, int] = defaultdict(int)
    for sid, role in roles.items():
        if role.on_device and role.category == Mem.SAVED_ACTIVATIONS:
            out[role.module or "(top level)"] += trace.storages[sid].nbytes
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def model_states(trace: Trace, roles: dict[int, StorageRole]) -> dict[str, int]:
    """Parameters, gradients and optimizer state on the device, independent of the peak."""
    out = dict.fromkeys((Mem.PARAMETERS, Mem.BUFFERS, Mem.GRADIENTS, Mem.OPTIMIZER_STATE), 0)
    for sid, role in roles.items():
        if role.on_device and role.category in out:
            out[role.category] += trace.storages[sid].nbytes
    return out


def cudnn_workspace_estimate(trace: Trace) -> int:
    """A rough cuDNN workspace: the largest operand of any convolution in the step.

    cuDNN picks algorithms whose scratch space is bounded by what is free; PyTorch allocates
    it through the caching allocator for the duration of the call. The figure is labeled an
    estimate until calibrated against measurements.
    """
    return max(convolution_operand_bytes(trace), default=0)


def convolution_operand_bytes(trace: Trace) -> list[int]:
    """Bytes of every operand of every convolution, in trace order (the candidates for
    ``cudnn_workspace_estimate``; ``search.fit`` interpolates them between batches)."""
    return [m.nbytes for e in trace.events if e.name in device_terms.CONV_OPS
            for m in (*e.inputs, *e.outputs)]


def downsample(
    points: list[tuple[int, str, str, int, int]], max_points: int
) -> list[tuple[int, str, str, int, int]]:
    """Keep at most ``max_points``: the highest point of each equal-width bucket."""
    if len(points) <= max_points or max_points <= 0:
        return points
    size = -(-len(points) // max_points)
    return [max(points[i:i + size], key=lambda p: p[3]) for i in range(0, len(points), size)]
