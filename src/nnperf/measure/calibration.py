"""``nnperf calibrate``: microbenchmarks that replace the generic efficiency constants.

Measured, on the device asked for:

* GEMM throughput over a grid of shapes (square, aligned and misaligned, and skinny
  batch-like ones) and dtypes;
* convolution throughput for common CNN shapes, relative to a GEMM of the same FLOPs;
* achievable memory bandwidth (copy and elementwise add) from cache-resident to large sizes;
* the cost of one tiny op: host dispatch (a loop of tiny ops timed on the host) and, on CUDA,
  the device time per back-to-back kernel (enqueued behind ``torch.cuda._sleep`` so the host
  cannot be the bottleneck);
* on CUDA, host<->device bandwidth and latency, pageable and pinned, 4 KB to 1 GB.

The results become a ``DeviceProfile`` (``save_profile`` format, plus a ``[measured]`` table of
headline figures) and a sidecar JSON of every raw measurement. On the CPU they also become a
device description in the GPU catalog schema, so the same time model can predict CPU steps:
peak rates are the best GEMM rate measured per dtype, bandwidth the best copy bandwidth,
``sm_count`` the intra-op threads. Because a CPU runs dispatch and math on one thread (no
asynchronous device), the CPU profile charges each op's whole fixed cost as
``kernel_overhead_s`` and sets the host dispatch costs to ~0, so the eager timeline of
``passes/timing.py`` adds op costs serially instead of overlapping host and device.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from nnperf.hardware import GPU, DeviceProfile, default_profile, save_profile
from nnperf.hardware.profile import interpolate
from nnperf.measure.device import (
    cpu_name,
    device_name,
    synchronize,
    time_batched,
    time_repeats,
)
from nnperf.measure.stats import Spread

SCHEMA_VERSION = "nnperf.calibration/1"
TORCH_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
#: Host dispatch is charged to the op itself on a CPU (see the module docstring): ~0 here.
CPU_HOST_DISPATCH_S = 1e-9

Progress = Callable[[str, int], None]  # (benchmark group, items done in it) -> None


@dataclass(frozen=True)
class Plan:
    """What to measure; ``plan_for`` scales it to the device and to ``--quick``."""

    gemm_sizes: tuple[int, ...]
    gemm_dtypes: tuple[str, ...]
    skinny_m: int
    conv_shapes: tuple[tuple[int, int, int, int, int, int], ...]  # batch, cin, hw, cout, kernel, stride
    conv_dtype: str
    bandwidth_bytes: tuple[int, ...]
    tiny_ops: int
    transfer_bytes: tuple[int, ...]
    repeats: int

    def counts(self) -> dict[str, int]:
        return {
            "gemm": len(self.gemm_dtypes) * len(self.gemm_sizes) * 3,
            "conv": len(self.conv_shapes),
            "bandwidth": len(self.bandwidth_bytes) * 2,
            "overhead": 3,
            "transfer": len(self.transfer_bytes) * 4,
        }


def _geometric(lo: int, hi: int, factor: int) -> tuple[int, ...]:
    out, v = [], lo
    while v <= hi:
        out.append(v)
        v *= factor
    return tuple(out)


def plan_for(device: torch.device, quick: bool = False) -> Plan:
    """A measurement plan: small on a CPU and with ``quick`` (under a minute on 2 cores)."""
    if device.type == "cuda":
        return Plan(
            gemm_sizes=(256, 512, 1024, 2048, 4096) if quick else (128, 256, 512, 1024, 2048, 4096, 8192),
            gemm_dtypes=("fp32", "tf32", "fp16", "bf16"),
            skinny_m=64,
            conv_shapes=((32, 64, 56, 64, 3, 1), (32, 256, 56, 64, 1, 1), (32, 128, 28, 128, 3, 1),
                         (32, 512, 7, 512, 3, 1), (32, 3, 224, 64, 7, 2)),
            conv_dtype="bf16",
            bandwidth_bytes=_geometric(2**16, 2**28 if quick else 2**31, 4),
            tiny_ops=1000,
            transfer_bytes=_geometric(2**12, 2**26 if quick else 2**30, 16 if quick else 4),
            repeats=5 if quick else 10,
        )
    return Plan(
        gemm_sizes=(64, 128, 256, 512) if quick else (64, 128, 256, 512, 1024, 2048),
        gemm_dtypes=("fp32", "bf16"),
        skinny_m=32,
        conv_shapes=((8, 32, 28, 32, 3, 1), (8, 64, 14, 64, 1, 1)) if quick
        else ((8, 64, 56, 64, 3, 1), (8, 256, 56, 64, 1, 1), (8, 128, 28, 128, 3, 1), (8, 3, 224, 64, 7, 2)),
        conv_dtype="fp32",
        bandwidth_bytes=_geometric(2**16, 2**24 if quick else 2**28, 4),
        tiny_ops=2000,
        transfer_bytes=(),
        repeats=3 if quick else 7,
    )


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
    conv: list[dict[str, Any]] = field(default_factory=list)
    bandwidth: list[dict[str, Any]] = field(default_factory=list)
    overhead: dict[str, Any] = field(default_factory=dict)
    transfer: list[dict[str, Any]] = field(default_factory=list)
    complete: bool = False

    def to_json(self) -> dict[str, Any]:
        noisy = [{"what": what, "p90_over_p10": r} for what, r in self.noisy()]
        return {"schema": SCHEMA_VERSION, **dataclasses.asdict(self), "noisy": noisy}

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
        groups = {"gemm": self.gemm, "conv": self.conv, "bandwidth": self.bandwidth, "transfer": self.transfer}
        for group, rows in groups.items():
            for row in rows:
                spread = row.get("spread") or {}
                low, high = spread.get("p10"), spread.get("p90")
                if low and high and high / low > ratio:
                    what = " ".join(str(row[k]) for k in ("kind", "dtype", "n", "m", "k", "bytes_moved", "bytes")
                                    if k in row)
                    out.append((f"{group} {what}", high / low))
        return sorted(out, key=lambda item: -item[1])

    def gemm_curve(self, dtype: str) -> list[tuple[float, float]]:
        """(FLOPs, achieved FLOP/s) of the aligned square GEMMs of ``dtype``."""
        pts = [(g["flops"], g["flops_per_s"]) for g in self.gemm if g["dtype"] == dtype and g["kind"] == "square"]
        return sorted(pts)


def _rand(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Random operands: zeros can take fast paths and flatter a kernel."""
    return torch.randn(shape, dtype=dtype, device=device)


def _timed(fn: Callable[[], object], device: torch.device, repeats: int) -> Spread:
    return Spread.of(time_batched(fn, device, repeats=repeats))


def run_calibration(
    device: torch.device,
    plan: Plan,
    progress: Progress | None = None,
    *,
    result: Calibration | None = None,
) -> Calibration:
    """Run every benchmark of ``plan``; ``result`` collects as it goes (partial on Ctrl-C)."""
    progress = progress or (lambda group, n: None)
    cal = result or new_calibration(device, quick=False)
    _gemms(cal, device, plan, progress)
    _convs(cal, device, plan, progress)
    _bandwidths(cal, device, plan, progress)
    _overheads(cal, device, plan, progress)
    if device.type == "cuda":
        _transfers(cal, device, plan, progress)
    cal.complete = True
    return cal


def new_calibration(device: torch.device, quick: bool) -> Calibration:
    return Calibration(
        device=str(device),
        device_name=device_name(device),
        quick=quick,
        date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        torch_version=torch.__version__,
        threads=torch.get_num_threads(),
    )


def _gemms(cal: Calibration, device: torch.device, plan: Plan, progress: Progress) -> None:
    done = 0
    previous = torch.backends.cuda.matmul.allow_tf32
    try:
        for dtype in plan.gemm_dtypes:
            torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
            tdt = TORCH_DTYPES[dtype]
            for n in plan.gemm_sizes:
                shapes = {"square": (n, n, n), "misaligned": (n + 1, n + 1, n + 1), "skinny": (plan.skinny_m, n, n)}
                for kind, (m, nn_, k) in shapes.items():
                    a, b = _rand((m, k), tdt, device), _rand((k, nn_), tdt, device)
                    spread = _timed(lambda a=a, b=b: torch.mm(a, b), device, plan.repeats)
                    flops = 2.0 * m * nn_ * k
                    cal.gemm.append({
                        "dtype": dtype, "kind": kind, "m": m, "n": nn_, "k": k, "flops": flops,
                        "time_s": spread.median, "spread": spread.to_json(),
                        "flops_per_s": flops / spread.median,
                    })
                    done += 1
                    progress("gemm", done)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def _convs(cal: Calibration, device: torch.device, plan: Plan, progress: Progress) -> None:
    tdt = TORCH_DTYPES[plan.conv_dtype]
    for i, (b, cin, hw, cout, ks, stride) in enumerate(plan.conv_shapes, 1):
        x = _rand((b, cin, hw, hw), tdt, device)
        w = _rand((cout, cin, ks, ks), tdt, device)
        pad = ks // 2
        spread = _timed(lambda x=x, w=w, s=stride, p=pad: F.conv2d(x, w, stride=s, padding=p), device, plan.repeats)
        out_hw = (hw + 2 * pad - ks) // stride + 1
        flops = 2.0 * b * cout * out_hw * out_hw * cin * ks * ks
        cal.conv.append({
            "dtype": plan.conv_dtype, "batch": b, "in_channels": cin, "hw": hw, "out_channels": cout,
            "kernel": ks, "stride": stride, "flops": flops, "time_s": spread.median,
            "spread": spread.to_json(), "flops_per_s": flops / spread.median,
        })
        progress("conv", i)


def _bandwidths(cal: Calibration, device: torch.device, plan: Plan, progress: Progress) -> None:
    done = 0
    for size in plan.bandwidth_bytes:
        n = size // 4
        src = _rand((n,), torch.float32, device)
        other = _rand((n,), torch.float32, device)
        dst = torch.empty_like(src)
        for kind, fn, moved in (
            ("copy", lambda d=dst, s=src: d.copy_(s), 2 * n * 4),
            ("elementwise", lambda d=dst, s=src, o=other: torch.add(s, o, out=d), 3 * n * 4),
        ):
            spread = _timed(fn, device, plan.repeats)
            cal.bandwidth.append({
                "kind": kind, "buffer_bytes": n * 4, "bytes_moved": moved, "time_s": spread.median,
                "spread": spread.to_json(), "bytes_per_s": moved / spread.median,
            })
            done += 1
            progress("bandwidth", done)
        del src, other, dst


def _overheads(cal: Calibration, device: torch.device, plan: Plan, progress: Progress) -> None:
    x = _rand((1,), torch.float32, device)
    y = torch.empty_like(x)
    n = plan.tiny_ops

    def loop() -> None:
        for _ in range(n):
            torch.add(x, 1.0, out=y)

    # host side: enqueue cost per op (on a CPU, the whole cost of a tiny op)
    for _ in range(2):
        loop()
    synchronize(device)
    host = []
    for _ in range(plan.repeats):
        t0 = time.perf_counter()
        loop()
        host.append((time.perf_counter() - t0) / n)
        synchronize(device)
    cal.overhead["host_per_op_s"] = Spread.of(host).to_json()
    progress("overhead", 1)
    views = []
    for _ in range(plan.repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            x.view(-1)
        views.append((time.perf_counter() - t0) / n)
    cal.overhead["view_per_op_s"] = Spread.of(views).to_json()
    progress("overhead", 2)
    if device.type == "cuda":
        cal.overhead["device_per_kernel_s"] = Spread.of(_device_per_kernel(loop, n, device, plan.repeats)).to_json()
    progress("overhead", 3)


def _device_per_kernel(loop: Callable[[], None], n: int, device: torch.device, repeats: int) -> list[float]:
    """Device time per back-to-back tiny kernel: the device is held busy by ``_sleep`` while
    the host enqueues the whole loop, so the events between time only the kernels."""
    out = []
    for _ in range(repeats):
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(int(2e8))  # ~0.1 s at ~2 GHz: longer than enqueueing n tiny ops
        start.record()
        loop()
        end.record()
        torch.cuda.synchronize(device)
        out.append(start.elapsed_time(end) / 1e3 / n)
    return out


def _transfers(cal: Calibration, device: torch.device, plan: Plan, progress: Progress) -> None:
    done = 0
    for size in plan.transfer_bytes:
        dev = torch.randint(0, 255, (size,), dtype=torch.uint8, device=device)
        for pinned in (False, True):
            host = torch.randint(0, 255, (size,), dtype=torch.uint8)
            if pinned:
                host = host.pin_memory()
            for direction, fn in (
                ("h2d", lambda h=host, d=dev: d.copy_(h, non_blocking=True)),
                ("d2h", lambda h=host, d=dev: h.copy_(d, non_blocking=True)),
            ):
                times = time_repeats(fn, device, warmup=2, repeats=plan.repeats)
                spread = Spread.of(times)
                cal.transfer.append({
                    "direction": direction, "pinned": pinned, "bytes": size, "time_s": spread.median,
                    "spread": spread.to_json(), "bytes_per_s": size / spread.median,
                })
                done += 1
                progress("transfer", done)
        del dev


# ---- from measurements to a profile and a device description -----------------------------
def peak_for_fraction(cal: Calibration, dtype: str, gpu: GPU | None) -> float | None:
    """The peak a GEMM efficiency curve is a fraction of: the datasheet on a GPU (the model
    multiplies the curve by the catalog peak), the best measured rate on a CPU."""
    if gpu is not None:
        try:
            if dtype == "tf32":
                return gpu.peak("tf32").flops
            return gpu.matmul_peak(dtype).flops
        except Exception:  # the GPU has no unit for this dtype: no curve for it
            return None
    return cal.best_gemm_flops(dtype)


def build_profile(cal: Calibration, gpu: GPU | None) -> DeviceProfile:
    """A ``DeviceProfile`` from measurements; ``gpu`` None means a CPU calibration."""
    base = default_profile(gpu)
    changes: dict[str, Any] = {}
    curves = {}
    for dtype in dict.fromkeys(g["dtype"] for g in cal.gemm):
        peak = peak_for_fraction(cal, dtype, gpu)
        if not peak:
            continue
        curves[dtype] = tuple((f, min(1.0, max(1e-4, r / peak))) for f, r in cal.gemm_curve(dtype))
    if curves:
        changes["gemm_efficiency"] = curves
    copy = sorted((b["bytes_moved"], b["bytes_per_s"]) for b in cal.bandwidth if b["kind"] == "copy")
    if copy:
        changes["bandwidth_curve"] = tuple(copy)
    host = cal.overhead.get("host_per_op_s", {}).get("median")
    view = cal.overhead.get("view_per_op_s", {}).get("median")
    if gpu is None:
        if host:
            changes["kernel_overhead_s"] = host
        changes["host_dispatch_s"] = CPU_HOST_DISPATCH_S
        changes["host_dispatch_backward_s"] = CPU_HOST_DISPATCH_S
        changes["host_dispatch_optimizer_s"] = CPU_HOST_DISPATCH_S
        if view:
            changes["host_view_s"] = view
        changes["tile_relative_efficiency"] = {**base.tile_relative_efficiency, "8x8": 1.0}
    else:
        device_kernel = cal.overhead.get("device_per_kernel_s", {}).get("median")
        if device_kernel:
            changes["kernel_overhead_s"] = device_kernel
        if host:
            # backward and optimizer ops keep the default ratios to a forward op (assumption)
            changes["host_dispatch_s"] = host
            changes["host_dispatch_backward_s"] = host * base.host_dispatch_backward_s / base.host_dispatch_s
            changes["host_dispatch_optimizer_s"] = host * base.host_dispatch_optimizer_s / base.host_dispatch_s
        if view:
            changes["host_view_s"] = view
    conv = conv_relative_efficiency(cal)
    if conv:
        changes["conv_relative_efficiency"] = conv
    note = (
        f"measured by nnperf calibrate{' --quick' if cal.quick else ''} on {cal.device_name} "
        f"({cal.device}), {cal.date}, torch {cal.torch_version}"
    )
    return dataclasses.replace(base, gpu=gpu.id if gpu else "cpu", note=note, **changes)


def conv_relative_efficiency(cal: Calibration) -> float | None:
    """Median over conv shapes of conv FLOP/s over the GEMM FLOP/s at the same FLOPs."""
    ratios = []
    for c in cal.conv:
        curve = cal.gemm_curve(c["dtype"])
        if not curve:
            continue
        ratios.append(c["flops_per_s"] / interpolate(curve, c["flops"]))
    if not ratios:
        return None
    return min(2.0, max(0.05, Spread.of(ratios).median))


def measured_table(cal: Calibration) -> dict[str, Any]:
    """Headline figures for the profile's ``[measured]`` table (shown beside the datasheet)."""
    out: dict[str, Any] = {"device_name": cal.device_name, "date": cal.date, "torch": cal.torch_version,
                           "quick": cal.quick}
    for dtype in dict.fromkeys(g["dtype"] for g in cal.gemm):
        out[f"gemm_best_tflops_{dtype}"] = (cal.best_gemm_flops(dtype) or 0.0) / 1e12
    for kind in ("copy", "elementwise"):
        rates = [b["bytes_per_s"] for b in cal.bandwidth if b["kind"] == kind]
        if rates:
            out[f"{kind}_bandwidth_gbs"] = max(rates) / 1e9
    for key, spread in cal.overhead.items():
        out[key.replace("_s", "_us")] = spread["median"] * 1e6
    for direction in ("h2d", "d2h"):
        for pinned in (False, True):
            rows = [t for t in cal.transfer if t["direction"] == direction and t["pinned"] == pinned]
            if rows:
                tag = f"{direction}_{'pinned' if pinned else 'pageable'}"
                out[f"{tag}_gbs"] = max(r["bytes_per_s"] for r in rows) / 1e9
                out[f"{tag}_latency_us"] = min(r["time_s"] for r in rows) * 1e6
    return out


def cpu_description(cal: Calibration) -> dict[str, Any]:
    """A device description in the GPU catalog schema for this CPU (usable as --gpu-file)."""
    peaks = {d: (cal.best_gemm_flops(d) or 0.0) / 1e12 for d in ("fp32", "bf16", "fp16")}
    mem = _total_memory_bytes()
    return {
        "id": "cpu",
        "name": f"CPU: {cpu_name()} ({cal.threads} threads)",
        "aliases": ["cpu"],
        "vendor": "CPU",
        "architecture": "cpu",
        "confidence": "measured",
        "notes": (
            f"Measured by nnperf calibrate{' --quick' if cal.quick else ''} on {cal.date}: peak rates are "
            "the best GEMM rates measured, bandwidth the best copy bandwidth, sm_count the intra-op threads."
        ),
        "sm_count": max(1, cal.threads),
        "boost_clock_mhz": _cpu_mhz(),
        "memory_gib": mem / 2**30 if mem else 1.0,
        "memory_type": "host DRAM",
        "memory_bandwidth_gbs": (cal.copy_bandwidth() or 1e9) / 1e9,
        "peak_tflops": {"cuda": {d: v for d, v in peaks.items() if v > 0}},
        "sources": {"measurement": f"nnperf calibrate --device cpu, {cal.date}"},
    }


def _total_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _cpu_mhz() -> float:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("cpu MHz"):
                value = float(line.split(":", 1)[1])
                if value > 0:
                    return value
    except (OSError, ValueError):
        pass
    return 1000.0


# ---- writing ------------------------------------------------------------------------------
def _toml_scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_scalar(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} to TOML")


def toml_text(raw: dict[str, Any]) -> str:
    """A small TOML writer for nested tables of scalars (the catalog schema needs no more)."""
    lines: list[str] = []
    tables: list[tuple[str, dict[str, Any]]] = []

    def emit(prefix: str, table: dict[str, Any]) -> None:
        scalars = {k: v for k, v in table.items() if not isinstance(v, dict)}
        if prefix:
            lines.extend(["", f"[{prefix}]"])
        lines.extend(f"{json.dumps(k) if not k.replace('_', '').isalnum() else k} = {_toml_scalar(v)}"
                     for k, v in scalars.items())
        for k, v in table.items():
            if isinstance(v, dict):
                tables.append((f"{prefix}.{k}" if prefix else k, v))

    emit("", raw)
    while tables:
        emit(*tables.pop(0))
    return "\n".join(lines) + "\n"


@dataclass
class Outputs:
    """Where a calibration writes: the profile, its raw sidecar JSON and (CPU) a device file."""

    profile: Path
    raw: Path
    device: Path | None

    @classmethod
    def for_profile(cls, profile: str | Path, device_file: str | Path | None, cpu: bool) -> Outputs:
        p = Path(profile)
        dev = Path(device_file) if device_file else (p.with_name(p.stem + "-device.toml") if cpu else None)
        return cls(profile=p, raw=p.with_suffix(".json"), device=dev)

    def paths(self) -> list[Path]:
        return [p for p in (self.profile, self.raw, self.device) if p is not None]


def write_outputs(cal: Calibration, gpu: GPU | None, outputs: Outputs) -> None:
    """Write every output atomically: temp files in the same folder, renamed only when all are
    written. An incomplete calibration is refused (nothing is ever written as if complete)."""
    if not cal.complete:
        raise ValueError("refusing to write an incomplete calibration as a profile")
    profile = build_profile(cal, gpu)
    texts: dict[Path, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp) / "profile.toml"
        save_profile(profile, scratch)
        texts[outputs.profile] = scratch.read_text() + "\n" + toml_text({"measured": measured_table(cal)})
    texts[outputs.raw] = json.dumps(cal.to_json(), indent=2) + "\n"
    if outputs.device is not None:
        texts[outputs.device] = "# nnperf device description of this CPU (use with --gpu-file)\n" + toml_text(
            cpu_description(cal)
        )
    staged: list[tuple[Path, Path]] = []
    try:
        for final, text in texts.items():
            final.parent.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".partial", dir=final.parent)
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
            staged.append((Path(name), final))
        for tmp_path, final in staged:
            os.replace(tmp_path, final)
    finally:
        for tmp_path, _ in staged:
            tmp_path.unlink(missing_ok=True)
