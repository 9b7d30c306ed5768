"""The raw measurements of one calibration run and the summaries the profile is built from."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = "nnperf.calibration/1"

#: ``Calibration.timing`` values: short kernels timed on the device alone, or with the host's
#: launch time showing through (``measure.device.time_batched``'s ``device_only``).
TIMING_DEVICE = "device"
TIMING_HOST_EXPOSED = "host-exposed"

#: Repeats of one measurement spread wider than this (p90 / p10) mark it as disturbed.
NOISE_RATIO = 2.0


@dataclass
class Calibration:
    """Raw measurements (seconds are medians; every spread is kept) and their summaries."""

    device: str
    device_name: str
    quick: bool
    date: str
    torch_version: str
    threads: int
    gemm: list[dict[str, Any]] = field(default_factory=list)
    batched_gemm: list[dict[str, Any]] = field(default_factory=list)
    conv: list[dict[str, Any]] = field(default_factory=list)
    conv_variants: list[dict[str, Any]] = field(default_factory=list)
    bandwidth: list[dict[str, Any]] = field(default_factory=list)
    overhead: dict[str, Any] = field(default_factory=dict)
    transfer: list[dict[str, Any]] = field(default_factory=list)
    attention: list[dict[str, Any]] = field(default_factory=list)
    # The host CPU the dispatch costs were measured on, and its maximum clock (GHz) as the
    # kernel reports it (hardware/host.py rescales host costs by that clock).
    host_cpu: str = ""
    host_max_ghz: float | None = None
    # SM clock (MHz) sampled while large GEMMs keep the GPU busy: the sustained clock the
    # datasheet peak (quoted at boost) does not state.
    clock_under_load_mhz: dict[str, Any] = field(default_factory=dict)
    # The parts of an eager step's host work (``host_parts.HostParts`` as JSON; {} before
    # calibrations measured them)
    host_parts: dict[str, Any] = field(default_factory=dict)
    complete: bool = False
    # How short kernels were timed: ``TIMING_DEVICE`` (queued behind a sleep, the device's
    # time alone) or ``TIMING_HOST_EXPOSED`` (raw files from before 2026-11-28: a kernel
    # shorter than its launch read as the host's launch time; ``profile.informative`` drops those)
    timing: str = TIMING_DEVICE

    def to_json(self) -> dict[str, Any]:
        noisy = [{"what": what, "p90_over_p10": r} for what, r in self.noisy()]
        return {"schema": SCHEMA_VERSION, **dataclasses.asdict(self), "noisy": noisy}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Calibration:
        """A calibration read back from its raw JSON (``to_json``), to build its profile again
        with the current derivation; a file without ``timing`` predates device-only timing."""
        if data.get("schema") != SCHEMA_VERSION:
            raise ValueError(f"not an nnperf calibration (schema {data.get('schema')!r}, expected {SCHEMA_VERSION!r})")
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{"timing": TIMING_HOST_EXPOSED, **{k: v for k, v in data.items() if k in names}})

    # ---- summaries ------------------------------------------------------------------------
    def best_gemm_flops(self, dtype: str) -> float | None:
        rates = [g["flops_per_s"] for g in self.gemm if g["dtype"] == dtype]
        return max(rates) if rates else None

    def copy_bandwidth(self) -> float | None:
        rates = [b["bytes_per_s"] for b in self.bandwidth if b["kind"] == "copy"]
        return max(rates) if rates else None

    def noisy(self, ratio: float = NOISE_RATIO) -> list[tuple[str, float]]:
        """Measurements whose repeats varied by more than ``ratio`` (p90 / p10), worst first:
        another process competing for the device, whose numbers a profile should not trust."""
        out = []
        groups = {"gemm": self.gemm, "batched gemm": self.batched_gemm, "conv": self.conv,
                  "conv variant": self.conv_variants, "bandwidth": self.bandwidth, "transfer": self.transfer,
                  "attention": self.attention}
        for group, rows in groups.items():
            for row in rows:
                spread = row.get("spread") or {}
                low, high = spread.get("p10"), spread.get("p90")
                if low and high and high / low > ratio:
                    what = " ".join(str(row[k]) for k in ("kind", "backend", "dtype", "n", "m", "k", "bytes_moved",
                                                          "bytes", "tokens", "head_dim")
                                    if k in row)
                    out.append((f"{group} {what}", high / low))
        return sorted(out, key=lambda item: -item[1])
