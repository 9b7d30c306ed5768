"""What one piece of advice changes, as a value that combines with others.

Every advice item is a what-if of the same workload: some change how the step is traced
(precision, optimizer implementation, recomputation, batch), some only how the traced ops
are timed (TF32, padded GEMMs, FP8 linears, fusion, CUDA graphs, another GPU). A ``Change``
holds both kinds, so ``--apply a,b`` is the merge of the items' changes, predicted as one
scenario rather than their gains multiplied.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from nnperf.errors import UsageError

#: Trace-level settings a change may set: TraceOptions fields and MemoryOptions' own.
TRACE_KEYS = ("amp", "dtype", "optimizer_impl", "set_to_none", "channels_last")


@dataclass(frozen=True)
class Change:
    """One scenario's difference from the workload as given (empty: the workload itself)."""

    trace: tuple[tuple[str, Any], ...] = ()  # (key, value) of TRACE_KEYS
    model: tuple[tuple[str, Any], ...] = ()  # (key, value) of the model's own options (-O)
    recompute: str | None = None  # "full" | "selective" activation checkpointing per block
    batch: int | None = None  # another batch size (the step re-traced at it)
    tf32: bool = False  # torch.backends.cuda.matmul.allow_tf32 = True
    pad: tuple[tuple[int, int], ...] = ()  # GEMM dimension -> padded size
    fp8: bool = False  # large linear GEMMs in FP8 (dynamic scaling)
    fuse: bool = False  # torch.compile: inductor's fusion of pointwise/reduction chains
    sdpa: bool = False  # hand-written attention replaced by fused SDPA
    graphs: bool = False  # the step replayed as one CUDA graph
    gpu: str | None = None  # another catalog GPU

    @property
    def retraces(self) -> bool:
        """Whether the step must be traced again (otherwise the base trace is re-timed)."""
        return bool(self.trace) or bool(self.model) or self.recompute is not None or self.batch is not None

    @property
    def checkpoint(self) -> bool:
        """Read by the parallel runner, which starts recomputing (slow) traces first."""
        return self.recompute is not None

    def trace_changes(self) -> dict[str, Any]:
        return dict(self.trace)

    def merge(self, other: Change) -> Change:
        """Both changes at once; two different values for one setting are a usage error."""
        out: dict[str, Any] = {}
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if f.name in ("trace", "model", "pad"):
                merged = dict(a)
                for key, value in b:
                    if key in merged and merged[key] != value:
                        raise UsageError(f"conflicting changes: {key} {merged[key]} and {value}")
                    merged[key] = value
                out[f.name] = tuple(sorted(merged.items(), key=lambda kv: str(kv[0])))
            elif isinstance(a, bool):
                out[f.name] = a or b
            elif a is not None and b is not None and a != b:
                raise UsageError(f"conflicting changes: {f.name} {a} and {b}")
            else:
                out[f.name] = a if a is not None else b
        return replace(self, **out)


@dataclass(frozen=True)
class Outcome:
    """A scenario's prediction: what the ranked list compares (small, so it pickles back
    from a worker process)."""

    step_s: float
    host_s: float
    device_busy_s: float
    bound: str
    samples: int
    tokens: int | None
    peak_bytes: float | None  # the memory model's device total; None: not re-predicted
    fits: bool | None
    gpu_id: str
    kernels: int
    notes: tuple[str, ...] = ()  # what the rewrites did or could not include
    # the wall time the optimizer and clipping add at the step's end (their kernels, or their
    # dispatch on a host-bound step): gradient accumulation runs them once
    # (trace.step.once_per_step)
    optimizer_s: float = 0.0
    touched: tuple[str, ...] = ()  # modules whose ops a rewrite changed

    @property
    def per_sample_s(self) -> float:
        return self.step_s / self.samples if self.samples else self.step_s

    @property
    def throughput(self) -> float:
        work = self.tokens or self.samples
        return work / self.step_s if self.step_s else 0.0

    @property
    def throughput_unit(self) -> str:
        return "tokens/s" if self.tokens else "samples/s"

    def to_json(self) -> dict[str, Any]:
        return {
            "step_time_s": self.step_s, "host_s": self.host_s, "device_busy_s": self.device_busy_s,
            "bound": self.bound, "batch": self.samples, "tokens": self.tokens,
            "throughput": self.throughput, "throughput_unit": self.throughput_unit,
            "peak_memory_bytes": self.peak_bytes, "fits_in_memory": self.fits, "gpu": self.gpu_id,
            "kernels": self.kernels,
        }


@dataclass
class Candidate:
    """An advice item before it is predicted: its change and the words that explain it."""

    name: str  # what --apply takes: "amp-bf16", "pad-vocabulary", ...
    family: str  # padding | batch | precision | optimizer | graphs | compile | layout | attention | recompute | gpu
    title: str
    change: Change
    how: str  # the exact change: a code line, a flag, or a diff of a module's shape
    layers: list[str] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)
    predicted: bool = True  # False: offered, but the time model cannot cost it (no gain shown)
    extra: dict[str, Any] = field(default_factory=dict)  # family-specific data (curve, blockers)
