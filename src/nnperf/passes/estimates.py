"""One additive record of what a group of ops costs: counts (FLOPs, bytes) and time terms.

Every tally of the project (a module's row, an op name's row, a phase, a roofline point, the
step's totals) is an ``Estimates``: the sum of its ops' records. Before, the counts, the
timed rows and the roofline each kept their own accumulator with its own rules, and a fix
to one did not reach the others. Sums are plain sums (``a + b``); the two peaks are maxima
(the fastest unit the group's arithmetic ran on), so ``+`` stays associative and
commutative and the order ops are added in never changes a figure. Everything derived
(intensity, achieved FLOP/s, share of peak, bound, bandwidth needed) is a property.

Counts alone (``from_counts``) leave the time terms at zero: an analysis has no GPU yet.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from nnperf.vocab import Category

if TYPE_CHECKING:
    from nnperf.passes.count import OpCount
    from nnperf.passes.timing import OpTime

#: Categories run on the matrix units: their peak is the group's peak when they have FLOPs.
MATRIX = frozenset({Category.GEMM, Category.CONV, Category.ATTENTION})

_MAX_FIELDS = ("matrix_peak_flops", "other_peak_flops")


@dataclass(frozen=True, slots=True)
class Estimates:
    """FLOPs, bytes split three ways, FLOPs and bytes per phase, and the time model's terms."""

    count: int = 0  # ops
    kernels: int = 0
    flops: float = 0.0
    macs: float = 0.0
    bytes_in: float = 0.0
    bytes_weights: float = 0.0
    bytes_out: float = 0.0
    flops_forward: float = 0.0
    flops_backward: float = 0.0
    flops_optimizer: float = 0.0
    # the part of flops_backward that re-runs forward ops (activation checkpointing)
    flops_recomputed: float = 0.0
    bytes_forward: float = 0.0
    bytes_backward: float = 0.0
    bytes_optimizer: float = 0.0
    # time terms (zero for counts alone)
    time_s: float = 0.0  # share of the step: kernels plus device idle waiting on the host
    kernel_s: float = 0.0
    idle_s: float = 0.0
    compute_s: float = 0.0  # FLOPs at the peak of their unit (roofline compute term)
    memory_s: float = 0.0  # DRAM bytes at datasheet bandwidth (roofline memory term; L2 hits left out)
    # The kernel model's terms (with the profile's efficiencies): with the launch overhead
    # and the device's wait on the host they decide ``bound``.
    model_compute_s: float = 0.0
    model_memory_s: float = 0.0
    overhead_s: float = 0.0
    matrix_peak_flops: float = 0.0  # fastest matrix unit the group's FLOPs ran on (max)
    other_peak_flops: float = 0.0  # fastest other unit, for groups without matrix FLOPs (max)
    # The whole step's bound, set on the root row only: decided by the timeline (host issue
    # time against device busy time) as the summary prints it, not by the largest term.
    step_bound: str | None = None

    # -- building ---------------------------------------------------------------------------
    def __add__(self, other: Estimates) -> Estimates:
        if not isinstance(other, Estimates):
            return NotImplemented
        return Estimates.total((self, other))

    @classmethod
    def total(cls, items: Iterable[Estimates]) -> Estimates:
        """The sum of ``items`` in one pass (a sum of many records builds one, not many)."""
        names = [f.name for f in fields(cls) if f.name != "step_bound"]
        acc = dict.fromkeys(names, 0)
        for item in items:
            for name in names:
                value = getattr(item, name)
                if name in _MAX_FIELDS:
                    if value > acc[name]:
                        acc[name] = value
                else:
                    acc[name] += value
        return cls(**acc)

    @classmethod
    def from_counts(cls, ops: Iterable[OpCount]) -> Estimates:
        """The counts of ``ops``; no time terms. One loop, no per-op record (the totals of a
        70k-op trace are on the analyze path)."""
        n = 0
        flops = macs = b_in = b_w = b_out = 0.0
        by_phase_f = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}
        by_phase_b = dict(by_phase_f)
        recomputed = 0.0
        for op in ops:
            n += 1
            flops += op.flops
            macs += op.macs
            b_in += op.bytes_in
            b_w += op.bytes_weights
            b_out += op.bytes_out
            phase = op.phase
            by_phase_f[phase] += op.flops
            if op.event.recomputed:
                recomputed += op.flops
            by_phase_b[phase] += op.bytes_in + op.bytes_weights + op.bytes_out
        return cls(
            count=n, flops=flops, macs=macs, bytes_in=b_in, bytes_weights=b_w, bytes_out=b_out,
            flops_forward=by_phase_f["forward"], flops_backward=by_phase_f["backward"],
            flops_optimizer=by_phase_f["optimizer"], flops_recomputed=recomputed, bytes_forward=by_phase_b["forward"],
            bytes_backward=by_phase_b["backward"], bytes_optimizer=by_phase_b["optimizer"],
        )

    @classmethod
    def from_times(cls, times: Iterable[OpTime]) -> Estimates:
        """Counts and time terms of timed ops (each ``OpTime`` refers to its ``OpCount``)."""
        times = list(times)
        counts = cls.from_counts(t.count for t in times)
        kernels = 0
        time_s = kernel_s = idle_s = compute_s = memory_s = mc = mm = oh = 0.0
        matrix_peak = other_peak = 0.0
        for t in times:
            kernels += t.kernels
            time_s += t.kernel_s + t.idle_before_s
            kernel_s += t.kernel_s
            idle_s += t.idle_before_s
            compute_s += t.compute_s
            memory_s += t.memory_s
            mc += t.model_compute_s
            mm += t.model_memory_s
            oh += t.overhead_s
            if t.count.flops and t.peak_flops:
                if t.count.category in MATRIX:
                    matrix_peak = max(matrix_peak, t.peak_flops)
                else:
                    other_peak = max(other_peak, t.peak_flops)
        return replace(
            counts, kernels=kernels, time_s=time_s, kernel_s=kernel_s, idle_s=idle_s,
            compute_s=compute_s, memory_s=memory_s, model_compute_s=mc, model_memory_s=mm,
            overhead_s=oh, matrix_peak_flops=matrix_peak, other_peak_flops=other_peak,
        )

    # -- derived ----------------------------------------------------------------------------
    @property
    def bytes(self) -> float:
        return self.bytes_in + self.bytes_weights + self.bytes_out

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved at minimum (arithmetic intensity)."""
        return self.flops / self.bytes if self.bytes else 0.0

    @property
    def peak_flops(self) -> float:
        """The peak ``fraction_of_peak`` divides by: the fastest matrix unit the group's
        arithmetic ran on, or for a group without matrix FLOPs the fastest other unit."""
        return self.matrix_peak_flops or self.other_peak_flops

    @property
    def demands(self) -> dict[str, float]:
        """Seconds the group would take if only one limit existed: its modeled compute, its
        modeled memory traffic, its kernels' launch overhead, the device's wait on the host."""
        return {
            "launch": self.overhead_s,
            "compute": self.model_compute_s,
            "memory": self.model_memory_s,
            "host": self.idle_s,
        }

    @property
    def bound(self) -> str:
        """The largest of ``demands``: for one op the kernel model's own verdict (launch when
        the overhead is at least both terms, else the larger term) unless it waited longer on
        the host; for a group, the limit whose removal would save the most, which is what the
        Compute and Memory columns show, so the label never contradicts them. The root row
        carries the step's bound instead (``step_bound``)."""
        if self.step_bound is not None:
            return self.step_bound
        items = {k: v for k, v in self.demands.items() if v > 0}
        return max(items, key=items.get) if items else "none"

    @property
    def achieved_flops(self) -> float:
        """FLOP/s the predicted kernel time implies."""
        return self.flops / self.kernel_s if self.kernel_s else 0.0

    @property
    def fraction_of_peak(self) -> float:
        return self.achieved_flops / self.peak_flops if self.peak_flops else 0.0

    def required_bw(self) -> dict[str, float] | None:
        """Bytes/s each stream needs to keep the math units busy (None: no arithmetic)."""
        if not self.compute_s:
            return None
        return {
            "in": self.bytes_in / self.compute_s,
            "out": self.bytes_out / self.compute_s,
            "weights": self.bytes_weights / self.compute_s,
        }

    # -- JSON -------------------------------------------------------------------------------
    def counts_json(self) -> dict[str, Any]:
        """The analysis' columns of a row (``modules[]``, ``ops[]``, ``totals``)."""
        return {
            "flops": self.flops,
            "macs": self.macs,
            "bytes": self.bytes,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "bytes_weights": self.bytes_weights,
            "flops_forward": self.flops_forward,
            "flops_backward": self.flops_backward,
            "flops_optimizer": self.flops_optimizer,
            "flops_recomputed": self.flops_recomputed,
        }

    def time_json(self) -> dict[str, Any]:
        """The prediction's columns of a row, added beside ``counts_json``."""
        return {
            "time_s": self.time_s,
            "kernel_s": self.kernel_s,
            "idle_s": self.idle_s,
            "compute_s": self.compute_s,
            "memory_s": self.memory_s,
            "compute_model_s": self.model_compute_s,
            "memory_model_s": self.model_memory_s,
            "bound": self.bound,
            "achieved_flops": self.achieved_flops,
            "fraction_of_peak": self.fraction_of_peak,
            "required_bw": self.required_bw(),
        }
