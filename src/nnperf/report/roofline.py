"""Roofline data (points per layer or per op, the GPU's roofs) and a static matplotlib chart.

The points are a *partition* of the step: every op lands in exactly one group (its module cut
to the chosen depth, or its aten name), so the points' times add up to the predicted step and
a reader can trust that nothing is hidden. A point sits at (arithmetic intensity, achieved
FLOP/s) = (FLOPs / minimum bytes, FLOPs / predicted kernel time); groups without FLOPs cannot
sit on a log axis and are listed beside the chart instead.

The HTML report (``nnperf.report.html``) and the PNG/SVG export read the same points, so a
slide and the interactive page never disagree. matplotlib is imported only when a static
image is asked for: it is an optional dependency (the ``plot`` extra).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nnperf.errors import UsageError
from nnperf.passes.estimates import Estimates
from nnperf.passes.rollup import ROOT_OWN_OPS, module_order, module_type
from nnperf.passes.timing import OpTime
from nnperf.prediction import Prediction
from nnperf.report.labels import module_label

#: How points are grouped: by module cut at a depth ("layer") or by aten op name ("op").
GROUPINGS = ("layer", "op")


@dataclass(frozen=True)
class RooflinePoint:
    """One group of ops: what it costs and where it sits on the roofline."""

    key: str  # module path cut at the depth (ROOT_OWN_OPS: the root's own ops) or op name
    label: str  # what a reader sees, as in the terminal tables ('(Net) own ops')
    type: str  # module class, or the op's category
    ops: int
    kernels: int
    flops: float
    bytes: float
    kernel_s: float  # predicted device time of its kernels
    time_s: float  # its share of the step: kernels plus device idle waiting on the host
    compute_s: float  # FLOPs at peak (roofline compute term)
    memory_s: float  # DRAM bytes at datasheet bandwidth (roofline memory term)
    bound: str  # what dominates its time: compute | memory | launch | host

    @property
    def intensity(self) -> float:
        """FLOP per DRAM byte (reads found in L2 left out, so no point sits above the roof)."""
        return self.flops / self.bytes if self.bytes else 0.0

    @property
    def achieved_flops(self) -> float:
        """FLOP/s its predicted kernel time implies."""
        return self.flops / self.kernel_s if self.kernel_s else 0.0

    @property
    def plottable(self) -> bool:
        """Whether it has a place on log-log axes (needs FLOPs, bytes and kernel time)."""
        return self.flops > 0 and self.bytes > 0 and self.kernel_s > 0

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "label": self.label,
            "type": self.type,
            "ops": self.ops,
            "kernels": self.kernels,
            "flops": self.flops,
            "bytes": self.bytes,
            "kernel_s": self.kernel_s,
            "time_s": self.time_s,
            "compute_s": self.compute_s,
            "memory_s": self.memory_s,
            "bound": self.bound,
            "intensity": self.intensity,
            "achieved_flops": self.achieved_flops,
        }


@dataclass(frozen=True)
class Roofs:
    """The ceilings of one GPU for one dtype: tensor (matrix) peak, CUDA-core peak, bandwidth."""

    gpu: str
    dtype: str  # the dtype the peaks are for (the one carrying most GEMM FLOPs)
    peak_flops: float  # matrix unit the GEMMs run on (tensor cores, or CUDA cores if none)
    peak_unit: str  # "tensor" | "cuda"
    peak_dtype: str  # rate actually used, e.g. "tf32"
    vector_flops: float  # CUDA cores, where elementwise and reduction ops run
    bandwidth: float  # bytes/s, datasheet

    @property
    def ridge(self) -> float:
        """FLOP per byte above which a kernel can be compute-bound on the matrix unit."""
        return self.peak_flops / self.bandwidth

    @property
    def vector_ridge(self) -> float:
        return self.vector_flops / self.bandwidth

    def to_json(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu,
            "dtype": self.dtype,
            "peak_flops": self.peak_flops,
            "peak_unit": self.peak_unit,
            "peak_dtype": self.peak_dtype,
            "vector_flops": self.vector_flops,
            "bandwidth": self.bandwidth,
            "ridge": self.ridge,
            "vector_ridge": self.vector_ridge,
        }


def roofs(prediction: Prediction) -> Roofs:
    """The roofs that matter for this step: the GPU's peaks for its main matmul dtype, the
    matrix roof at the math that carries most of the matrix FLOPs (an fp32 CNN's convolutions
    run TF32 by cuDNN's default, so its points sit under the TF32 roof, not the fp32 one)."""
    gpu = prediction.gpu
    dtype = prediction.matmul_dtype
    if prediction.mfu_peak.math.split("+")[0] == "tf32":
        peak = gpu.peak("tf32")
    else:
        peak = gpu.matmul_peak(dtype, tf32=prediction.timing.tf32_matmul, fallback=True)
    vector = gpu.peak(dtype, tensor_cores=False, fallback=True)
    return Roofs(
        gpu=gpu.name,
        dtype=dtype,
        peak_flops=peak.flops,
        peak_unit=peak.unit,
        peak_dtype=peak.dtype,
        vector_flops=vector.flops,
        bandwidth=gpu.memory_bandwidth,
    )


def cut(module: str, depth: int) -> str:
    """A module path cut to at most ``depth`` components (the group a layer's op falls in).

    Depth 0 is one group, '' (the whole step, as the root row of ``predict``); below it an op
    the root module calls itself falls in ``ROOT_OWN_OPS``, the group ``predict`` and
    ``--json`` show under the same name, never in '', which always means the whole step."""
    if depth <= 0:
        return ""
    if not module:
        return ROOT_OWN_OPS
    return ".".join(module.split(".")[:depth])


def roofline_points(prediction: Prediction, *, by: str = "layer", depth: int = 2) -> list[RooflinePoint]:
    """Group the step's ops into points; order: model (tree) order for layers, time for ops."""
    if by not in GROUPINGS:
        raise UsageError(f"invalid grouping '{by}': expected one of {', '.join(GROUPINGS)}")
    analysis = prediction.analysis
    key_of: Callable[[Any], str] = (lambda t: cut(t.module, depth)) if by == "layer" else (lambda t: t.op)
    groups: dict[str, list[OpTime]] = defaultdict(list)
    for t in prediction.step.ops:
        groups[key_of(t)].append(t)
    tallies = {key: Estimates.from_times(ts) for key, ts in groups.items()}
    types = analysis.trace.module_types
    root = analysis.root_type
    if by == "layer":
        keys = module_order(types, tallies)
    else:
        keys = sorted(tallies, key=lambda k: -tallies[k].time_s)
    points = []
    for key in keys:
        tally = tallies[key]
        if by == "layer":
            label = module_label(key, root)
            kind = module_type(types, key)
        else:
            label, kind = key, groups[key][0].category
        points.append(
            RooflinePoint(
                key=key,
                label=label,
                type=kind,
                ops=tally.count,
                kernels=tally.kernels,
                flops=tally.flops,
                bytes=tally.memory_s * prediction.gpu.memory_bandwidth,  # DRAM bytes: L2 hits left out
                kernel_s=tally.kernel_s,
                time_s=tally.time_s,
                compute_s=tally.compute_s,
                memory_s=tally.memory_s,
                bound=tally.bound,
            )
        )
    return points


# ---- static chart (matplotlib) ------------------------------------------------------------

BOUND_COLORS = {
    "compute": "#1f77b4",
    "memory": "#d62728",
    "launch": "#ff7f0e",
    "host": "#9467bd",
    "none": "#7f7f7f",
}


def axis_limits(points: list[RooflinePoint], r: Roofs) -> tuple[float, float, float, float]:
    """Decade-aligned (xmin, xmax, ymin, ymax) that show every point, both roofs and the ridge."""
    import math

    xs = [p.intensity for p in points if p.plottable] + [r.ridge, r.vector_ridge]
    ys = [p.achieved_flops for p in points if p.plottable] + [r.peak_flops, r.vector_flops]
    xmin = 10 ** math.floor(math.log10(min(xs) / 2))
    xmax = 10 ** math.ceil(math.log10(max(xs) * 4))
    ymin = 10 ** math.floor(math.log10(min(min(ys), r.bandwidth * xmin) / 2))
    ymax = 10 ** math.ceil(math.log10(max(ys) * 1.5))
    return xmin, xmax, ymin, ymax


def roofline_figure(predictions: Prediction | Sequence[Prediction], *, by: str = "layer", depth: int = 2,
                    title: str | None = None):
    """A matplotlib Figure of the roofline with one point per group (for papers and slides);
    several predictions (the same step on several GPUs) side by side on the same axes' scale,
    so the GPUs compare at a glance."""
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        from matplotlib.figure import Figure
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise UsageError("static roofline images need matplotlib: pip install 'nnperf[plot]'") from err
    many = list(predictions) if isinstance(predictions, Sequence) else [predictions]
    panels = [([p for p in roofline_points(pred, by=by, depth=depth) if p.plottable], roofs(pred), pred)
              for pred in many]
    limits = [axis_limits(points, r) for points, r, _ in panels]
    shared = (min(lim[0] for lim in limits), max(lim[1] for lim in limits),
              min(lim[2] for lim in limits), max(lim[3] for lim in limits))
    fig = Figure(figsize=(7.5 * len(panels), 5), dpi=150, layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (points, r, pred) in zip(axes, panels, strict=True):
        _draw_roofline(ax, points, r, shared, title or _title(pred, r, by, depth))
    return fig


def _title(prediction: Prediction, r: Roofs, by: str, depth: int) -> str:
    what = f"per layer (depth {depth})" if by == "layer" else "per op"
    return f"{prediction.analysis.label} on {r.gpu}, {what}"


def _draw_roofline(ax, points: list[RooflinePoint], r: Roofs, limits: tuple[float, float, float, float],
                   title: str) -> None:
    xmin, xmax, ymin, ymax = limits
    ax.set_xscale("log")
    ax.set_yscale("log")
    for peak, style, name in (
        (r.peak_flops, "-", f"{r.peak_dtype} {r.peak_unit} peak"),
        (r.vector_flops, "--", f"{r.dtype} CUDA-core peak"),
    ):
        if style == "--" and peak == r.peak_flops:
            continue  # same unit (e.g. fp32 without TF32): one roof, not two on top of each other
        ridge = peak / r.bandwidth
        x0 = max(xmin, ymin / r.bandwidth)
        ax.plot([x0, ridge, xmax], [r.bandwidth * x0, peak, peak], style, color="black", lw=1.2,
                label=f"{name} {peak / 1e12:.4g} TFLOP/s")
    ax.axvline(r.ridge, color="gray", ls=":", lw=1)
    ax.annotate(f"ridge {r.ridge:.3g} FLOP/B", (r.ridge, ymin), xytext=(4, 6), textcoords="offset points",
                fontsize=8, color="gray", rotation=90, va="bottom")
    for bound in BOUND_COLORS:
        sel = [p for p in points if p.bound == bound]
        if sel:
            ax.scatter([p.intensity for p in sel], [p.achieved_flops for p in sel], s=22,
                       color=BOUND_COLORS[bound], alpha=0.8, edgecolors="white", linewidths=0.5,
                       label=f"{bound}-bound ({len(sel)})", zorder=3)
    ax.set_xlim(xmin, xmax)
    ax.set_ylim(ymin, ymax)
    ax.set_xlabel("Arithmetic intensity (FLOP per byte moved)")
    ax.set_ylabel("Achieved FLOP/s (predicted; FLOP = 2 x MAC)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="major", color="#ddd", lw=0.6)
    ax.legend(fontsize=7, loc="lower right")


def save_roofline(
    prediction: Prediction | Sequence[Prediction], path: str | Path, *, by: str = "layer", depth: int = 2,
    fmt: str | None = None,
) -> Path:
    """Write the static roofline as ``fmt`` (default: from the suffix: .png, .svg, .pdf); one
    panel per prediction."""
    path = Path(path)
    fmt = (fmt or path.suffix.lstrip(".") or "png").lower()
    if fmt not in ("png", "svg", "pdf"):
        raise UsageError(f"cannot write a roofline as '.{fmt}': use .png, .svg or .pdf")
    fig = roofline_figure(prediction, by=by, depth=depth)
    fig.savefig(path, format=fmt, metadata={"Date": None} if fmt == "svg" else None)
    return path
