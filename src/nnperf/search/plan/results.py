"""What a plan computes, as records: below every module that fills them.

``RankFigures`` are the numbers one traced rank reduces to (``plan.rank``), every one additive
over the blocks of a deep stack, so a stack's figures are a line through two shallow traces
(``plan.rank.extrapolate``); ``RankCost`` adds what is not a number. ``Planned`` is one layout
as the plan reports it (step, memory, its time split, per-rank state bytes, collectives, its
pipeline's figures), ``Plan`` the search's result. A figure read by name is a field: a
misspelt name is an error, not a silent zero. What stays a mapping is keyed by data: a
collective kind, a phase of the step, a pipeline action.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

from nnperf.hardware import GPU
from nnperf.hardware.cluster import Cluster
from nnperf.layout import Execution
from nnperf.passes.memory.transfers import TransferBytes
from nnperf.trace.options import TraceOptions

#: The plan document's schema. 2: ``first_stage_layers``/``last_stage_layers`` are an end
#: stage's blocks over its chunks (1 read them as the model's first and last chunk).
PLAN_SCHEMA = "nnperf.plan/2"

@dataclass
class StateBytes:
    """One rank's persistent state: parameter, gradient and optimizer-state bytes."""

    parameters: float = 0.0
    gradients: float = 0.0
    optimizer_state: float = 0.0

    @property
    def total(self) -> float:
        return self.parameters + self.gradients + self.optimizer_state

    def __add__(self, other: StateBytes) -> StateBytes:
        """Two holdings on one rank together (a pipeline rank's chunks)."""
        return StateBytes(self.parameters + other.parameters, self.gradients + other.gradients,
                          self.optimizer_state + other.optimizer_state)

    def to_json(self) -> dict[str, int]:
        return {"parameters": round(self.parameters), "gradients": round(self.gradients),
                "optimizer_state": round(self.optimizer_state)}


def per_step(micro_batches: float, figure: float, once: float) -> float:
    """A traced micro-batch's ``figure`` over a step of ``micro_batches``, its ``once`` part
    (the optimizer, clipping, the data-parallel reduction of ``RankFigures.sync_s``: what runs
    once per step) counted once."""
    return micro_batches * max(0.0, figure - once) + once  # an extrapolated part can pass its whole


@dataclass
class RankFigures:
    """A traced rank as numbers, each additive over the blocks of a stack (``combine``)."""

    step_s: float = 0.0  # the step with its collectives beside the compute
    compute_s: float = 0.0  # kernel time on the compute stream
    comm_s: float = 0.0  # collective time on the communication streams
    slowdown_s: float = 0.0  # compute time added by collectives running beside kernels
    host_s: float = 0.0  # when the host has issued the step, its waits at syncs included: a bound
    host_busy_s: float = 0.0  # the host's time issuing the step (its waits for the device not counted)
    optimizer_s: float = 0.0  # kernels that run once per step (optimizer, clipping)
    optimizer_host_s: float = 0.0  # the host's time to issue them
    once_span_s: float = 0.0  # the once-per-step tail of the step (search.accumulation)
    recompute_s: float = 0.0  # kernels activation checkpointing runs again
    memory: float = 0.0  # the device total at the peak
    #: the highest allocated bytes of each phase of the step, by phase
    memory_by_phase: dict[str, float] = field(default_factory=dict)
    #: what the optimizer step allocates beyond what backward left allocated (its temporaries: a
    #: foreach optimizer's intermediates, ZeRO-1's fp32 copies of the gradients)
    optimizer_rise: float = 0.0
    mem_outside: float = 0.0  # what the device holds beyond the allocated peak (not additive: the larger)
    mem_context: float = 0.0  # what it holds beyond the reserved peak: the CUDA context (the larger)
    flops: float = 0.0  # the model's FLOPs (MFU's numerator)
    saved_activations: float = 0.0
    loss_saved: float = 0.0  # what the loss keeps for backward
    model_states: float = 0.0  # parameters, gradients and optimizer state in the memory pass
    attention_s: float = 0.0
    attention_forward_s: float = 0.0  # of it, in forward (the rest: backward and recomputation)
    attention_recomputed_s: float = 0.0  # of it, recomputed in backward (activation checkpointing)
    attention_flops: float = 0.0
    attention_layers: float = 0.0
    kv_bytes: float = 0.0  # the keys and values attention's forward reads
    param_row_bytes: float = 0.0  # search.plan.states
    states: StateBytes = field(default_factory=StateBytes)
    exposed_s: dict[str, float] = field(default_factory=dict)  # collective kind -> compute waited
    #: what the data-parallel engine's once-per-step synchronization costs the traced
    #: micro-batch: on a pipeline rank all of it (DDP's or ZeRO-1's reduction in the last
    #: micro-batch's backward, ZeRO-1's and FSDP2's parameter all-gathers before the first
    #: forward); without a pipeline, DDP's and ZeRO-1's reduction before the once-per-step ops
    #: (``no_sync`` micro-batches skip it). The compute stream's waits for it by kind, its
    #: kernels, its stretch of the kernels beside it, its collectives' time on their stream.
    sync_exposed_s: dict[str, float] = field(default_factory=dict)
    sync_kernel_s: float = 0.0
    sync_slowdown_s: float = 0.0
    sync_comm_s: float = 0.0
    #: without a pipeline, the compute stream's waits from the first once-per-step op on, by
    #: kind: inside ``once_span_s``, so once per step
    once_exposed_s: dict[str, float] = field(default_factory=dict)
    collective_count: dict[str, float] = field(default_factory=dict)  # by collective kind
    collective_bytes: dict[str, float] = field(default_factory=dict)  # by collective kind
    #: what running this micro-batch's backward beside the next one's forward saves, its
    #: all-to-alls behind the other's compute (``Execution.expert_overlap``:
    #: ``search.plan.expert_overlap``); 0 without it
    expert_overlap_s: float = 0.0
    #: a pipeline rank's actions: the mean time of each kind of action of each stage ("F@0")
    action_s: dict[str, float] = field(default_factory=dict)
    head_s: float = 0.0  # before a pipeline rank's first action
    tail_s: float = 0.0  # after its last (optimizer, gradient synchronization)
    p2p_bytes: float = 0.0  # the activation a pipeline stage sends forward
    #: of ``saved_activations``, a pipeline stage's receive buffers and sent output, which its
    #: engine holds otherwise than per micro-batch in flight (``passes.memory.transfers``)
    transfers: TransferBytes = field(default_factory=TransferBytes)

    @property
    def sync_s(self) -> float:
        """The wall time the once-per-step synchronization adds to the traced micro-batch."""
        return sum(self.sync_exposed_s.values()) + self.sync_kernel_s + self.sync_slowdown_s

    def exposed_over(self, micro_batches: float) -> dict[str, float]:
        """The compute stream's waits by kind over a step of ``micro_batches``, the
        once-per-step synchronization's and the once-per-step tail's counted once."""
        return {k: per_step(micro_batches, v, self.sync_exposed_s.get(k, 0.0) + self.once_exposed_s.get(k, 0.0))
                for k, v in self.exposed_s.items() if v > 0}

    def comm_over(self, micro_batches: float) -> float:
        """The collectives' time over a step of ``micro_batches``, the synchronization's once."""
        return per_step(micro_batches, self.comm_s, self.sync_comm_s)

    def slowdown_over(self, micro_batches: float) -> float:
        """The stretch of compute by collectives over a step of ``micro_batches``, the
        synchronization's once."""
        return per_step(micro_batches, self.slowdown_s, self.sync_slowdown_s)

    def action(self, kind: str, stage: int) -> float:
        """The mean time of a pipeline action of this rank (``F``, ``B``, ``I``, ``W``)."""
        return self.action_s.get(f"{kind}@{stage}", 0.0)

    def combine(self, other: RankFigures, op: Callable[[float, float], float]) -> RankFigures:
        """Field by field, ``op`` of this and ``other``'s figures (a mapping's keys: both's)."""
        return _combine(self, other, op)


def _combine(a: Any, b: Any, op: Callable[[float, float], float]) -> Any:
    values: dict[str, Any] = {}
    for f in fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, dict):
            values[f.name] = {k: op(x.get(k, 0.0), y.get(k, 0.0)) for k in dict.fromkeys([*x, *y])}
        elif isinstance(x, StateBytes | TransferBytes):
            values[f.name] = _combine(x, y, op)
        else:
            values[f.name] = op(x, y)
    return replace(a, **values)


@dataclass
class RankCost:
    """A traced rank: its figures and what is not a number."""

    figures: RankFigures = field(default_factory=RankFigures)
    mfu_peak: float = 0.0
    per_micro: int = 0  # tokens (or samples) of one micro-batch
    unit: str = "samples/s"
    stages: tuple[int, ...] = ()  # pipeline stages this rank holds
    pipeline_order: dict[int, list[str]] = field(default_factory=dict)
    rank: int = 0  # the rank traced
    #: what one more block adds to each figure, where the cost is a deep stack extrapolated from
    #: two shallow traces (``extrapolate``); None for a stack traced as it is
    per_block: RankFigures | None = None


@dataclass
class CollectiveTotals:
    """How many collectives of one kind a rank issues over the step, and their bytes."""

    count: float
    bytes: float

    def to_json(self) -> dict[str, int]:
        return {"count": round(self.count), "bytes": round(self.bytes)}


def collective_totals(*figures: RankFigures) -> dict[str, CollectiveTotals]:
    """A traced rank's collectives by kind (several: a pipeline rank's chunks, together)."""
    kinds = dict.fromkeys(kind for f in figures for kind in f.collective_count)
    return {kind: CollectiveTotals(sum(f.collective_count.get(kind, 0.0) for f in figures),
                                   sum(f.collective_bytes.get(kind, 0.0) for f in figures))
            for kind in kinds}


@dataclass
class TimeSplit:
    """Where a layout's step goes: compute (with what recomputation and overlapping collectives
    add), communication and what of it is exposed, per kind, the host's time; for a pipeline
    its bubble and what follows the schedule; a stated modelling note (context parallelism)."""

    compute_s: float
    recomputation_s: float
    communication_s: float
    overlap_slowdown_s: float
    exposed_communication_s: dict[str, float]
    host_s: float  # the host's time issuing the step's work (its waits for the device at syncs not counted)
    pipeline_bubble_s: float | None = None
    after_schedule_s: float | None = None
    context_parallel: str | None = None

    @property
    def exposed_s(self) -> float:
        return sum(self.exposed_communication_s.values())

    @property
    def compute_alone_s(self) -> float:
        """The compute without what overlapping collectives slowed (which the layout's
        communication decides)."""
        return self.compute_s - self.overlap_slowdown_s

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"compute_s": self.compute_s, "recomputation_s": self.recomputation_s}
        if self.pipeline_bubble_s is not None:
            out["pipeline_bubble_s"] = self.pipeline_bubble_s
        if self.after_schedule_s is not None:
            out["after_schedule_s"] = self.after_schedule_s
        out.update(communication_s=self.communication_s, overlap_slowdown_s=self.overlap_slowdown_s,
                   exposed_communication_s=self.exposed_communication_s, host_s=self.host_s)
        if self.context_parallel is not None:
            out["context_parallel"] = self.context_parallel
        return out


@dataclass
class PipelineFigures:
    """A pipeline layout's schedule as replayed: stages, micro-batches, the bubble's share of
    the critical rank's schedule, that rank, the micro-batches each stage keeps in flight, the
    bytes of one transfer between stages, each rank's parameter bytes."""

    stages: int
    micro_batches: int
    bubble_fraction: float
    critical_rank: int
    in_flight: dict[int, int]
    transfer_bytes: int
    parameter_bytes_per_rank: dict[int, float]

    def to_json(self) -> dict[str, Any]:
        return {"stages": self.stages, "micro_batches": self.micro_batches,
                "bubble_fraction": self.bubble_fraction, "critical_rank": self.critical_rank,
                "in_flight": {str(s): n for s, n in sorted(self.in_flight.items())},
                "transfer_bytes": self.transfer_bytes,
                "parameter_bytes_per_rank": {str(r): int(v) for r, v in self.parameter_bytes_per_rank.items()}}


@dataclass
class Planned:
    execution: Execution
    step_s: float = 0.0
    throughput: float = 0.0
    throughput_unit: str = "samples/s"
    mfu: float = 0.0
    memory_bytes: int = 0  # the device total per GPU: what nvidia-smi shows, the fit is judged on
    #: what the device total holds outside the caching allocator (the CUDA context): the rest is
    #: torch.cuda.max_memory_reserved(), what training frameworks log as memory
    context_bytes: int = 0
    fits: bool = False
    split: TimeSplit | None = None  # None: not timed (a bound)
    state_bytes: StateBytes | None = None  # None: not traced (a bound)
    collectives: dict[str, CollectiveTotals] = field(default_factory=dict)  # by kind
    reason: str = ""
    pipeline: PipelineFigures | None = None
    memory_bound: str = ""  # what memory_bytes counts when it is a lower bound (pruned unfit: not timed)
    time_bound: str = ""  # what step_s counts when it is a lower bound (pruned slower: not traced further)
    param_row_bytes: float = 0.0  # per-rank parameter row bytes (search.plan.states)
    #: the rank whose figures these are: the first of its role (a pipeline's critical stage)
    rank: int = 0
    loss_saved_bytes: int = 0  # what the loss keeps for backward (an eager cross entropy's copies of the logits)
    #: what one more block adds to the traced rank (``RankCost.per_block``): its persistent state
    #: (parameters and optimizer state) and its saved activations (``search.plan.bounds``)
    per_block: RankFigures | None = None

    def to_json(self) -> dict[str, Any]:
        return {"layout": self.execution.describe(), "execution": self.execution.to_json(),
                "step_time_s": self.step_s, "throughput": self.throughput,
                "throughput_unit": self.throughput_unit, "mfu": self.mfu,
                "memory_bytes": self.memory_bytes, "reserved_bytes": self.memory_bytes - self.context_bytes,
                "memory_is_lower_bound": bool(self.memory_bound),
                "step_time_is_lower_bound": bool(self.time_bound),
                "fits": self.fits, "time_split_s": self.split.to_json() if self.split else {},
                "rank": self.rank,
                "per_rank_state_bytes": self.state_bytes.to_json() if self.state_bytes else {},
                "collectives": {k: v.to_json() for k, v in self.collectives.items()},
                "pipeline": self.pipeline.to_json() if self.pipeline else {}, "reason": self.reason}


@dataclass
class Plan:
    model: str
    gpu: GPU
    cluster: Cluster
    gpus: int
    global_batch: int
    ranked: list[Planned]
    rejected: list[Planned]
    notes: list[str] = field(default_factory=list)
    traces: int = 0  # rank roles traced (the search's cost)
    layers: int | None = None  # repeated blocks of a built-in stack
    options: TraceOptions = field(default_factory=TraceOptions)  # the step every rank runs
    model_options: dict[str, Any] = field(default_factory=dict)  # -O overrides of a built-in model
    seq_len: int | None = None  # --seq, or a built-in model's default sequence
    #: the space searched, after the model's and the GPUs' rules: degrees per axis, schedules,
    #: data-parallel engines, checkpointing levels, FSDP resharding (``--json``'s "search")
    search: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"schema": PLAN_SCHEMA, "model": self.model, "model_options": self.model_options,
                "seq_len": self.seq_len, "gpu": self.gpu.id,
                "cluster": self.cluster.to_json(), "gpus": self.gpus, "global_batch": self.global_batch,
                "options": self.options.to_json(), "search": self.search,
                "ranked": [p.to_json() for p in self.ranked],
                "rejected": [p.to_json() for p in self.rejected], "notes": self.notes,
                "traced_roles": self.traces}
