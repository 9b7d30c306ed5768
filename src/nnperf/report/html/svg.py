"""Inline SVG charts drawn in Python: the roofline and the memory timeline.

Why Python and not JavaScript: the same SVG then works in the standalone report, in a
notebook output cell (where scripts are often not run: untrusted notebooks, GitHub's viewer)
and with scripts disabled; every point carries a native ``<title>`` tooltip, and the page's
small script only upgrades it to a richer one. All text that can come from user code goes
through ``esc`` (module names are arbitrary strings in PyTorch).
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

from nnperf.report.roofline import BOUND_COLORS, RooflinePoint, Roofs, axis_limits
from nnperf.units import binary, seconds, si

W, H = 640, 420
ML, MR, MT, MB = 64, 16, 16, 44  # margins: left, right, top, bottom


def esc(text: object) -> str:
    """Escape for HTML/SVG text and double-quoted attributes."""
    return html.escape(str(text), quote=True)


def _f(v: float) -> str:
    return f"{v:.1f}"


class LogAxes:
    """Maps data to pixels on log-log axes inside the chart margins."""

    def __init__(self, xmin: float, xmax: float, ymin: float, ymax: float, w: int = W, h: int = H):
        self.lx0, self.lx1 = math.log10(xmin), math.log10(xmax)
        self.ly0, self.ly1 = math.log10(ymin), math.log10(ymax)
        self.w, self.h = w, h

    def x(self, v: float) -> float:
        return ML + (math.log10(v) - self.lx0) / (self.lx1 - self.lx0) * (self.w - ML - MR)

    def y(self, v: float) -> float:
        return self.h - MB - (math.log10(v) - self.ly0) / (self.ly1 - self.ly0) * (self.h - MT - MB)


def point_title(p: RooflinePoint, measured_s: float | None = None) -> str:
    """The plain-text tooltip of a point (native SVG title; the script shows a richer one)."""
    lines = [
        f"{p.label} ({p.type})",
        f"FLOPs: {si(p.flops, 'FLOP')}  bytes: {binary(p.bytes)}  intensity: {p.intensity:.3g} FLOP/B",
        f"predicted: {seconds(p.kernel_s)} of kernels ({si(p.achieved_flops, 'FLOP/s')})"
        + (f", {seconds(p.time_s)} of the step with the device's wait on the host"
           if seconds(p.time_s) != seconds(p.kernel_s) else ""),
        f"measured: {seconds(measured_s) if measured_s else 'not measured'}",
        f"bound: {p.bound}",
    ]
    return "\n".join(lines)


def roofline_svg(
    points: Sequence[RooflinePoint],
    r: Roofs,
    *,
    chart_id: str = "roofline",
    run: int = 0,
    measured: dict[str, float] | None = None,
) -> str:
    """The roofline chart: both roofs, the ridge, one circle per plottable point.

    Circles carry ``data-i`` (index into ``points``) for the page script's tooltip;
    a measured time, when given for a point's key, adds a hollow diamond at the FLOP/s the
    measurement implies, joined to the predicted circle.
    """
    measured = measured or {}
    shown = [(i, p) for i, p in enumerate(points) if p.plottable]
    xmin, xmax, ymin, ymax = axis_limits([p for _, p in shown], r)
    ax = LogAxes(xmin, xmax, ymin, ymax)
    out = [
        f'<svg class="roofline" id="{esc(chart_id)}" data-run="{run}" viewBox="0 0 {W} {H}" width="{W}" height="{H}" '
        f'role="img" aria-label="Roofline chart of {esc(r.gpu)}" xmlns="http://www.w3.org/2000/svg">',
        f'<rect x="{ML}" y="{MT}" width="{W - ML - MR}" height="{H - MT - MB}" class="plot-bg"/>',
    ]
    # decade grid and labels
    for d in range(round(ax.lx0), round(ax.lx1) + 1):
        x = ax.x(10.0**d)
        out.append(f'<line class="grid" x1="{_f(x)}" x2="{_f(x)}" y1="{MT}" y2="{H - MB}"/>')
        out.append(f'<text class="tick" x="{_f(x)}" y="{H - MB + 14}" text-anchor="middle">{esc(_decade(d))}</text>')
    for d in range(round(ax.ly0), round(ax.ly1) + 1):
        y = ax.y(10.0**d)
        out.append(f'<line class="grid" x1="{ML}" x2="{W - MR}" y1="{_f(y)}" y2="{_f(y)}"/>')
        out.append(f'<text class="tick" x="{ML - 4}" y="{_f(y + 3)}" text-anchor="end">{esc(si(10.0**d))}</text>')
    out.append(f'<text class="axis-label" x="{(W + ML) / 2:.0f}" y="{H - 8}" text-anchor="middle">'
               "Arithmetic intensity (FLOP per byte moved)</text>")
    out.append(f'<text class="axis-label" transform="rotate(-90)" x="{-(H - MB + MT) / 2:.0f}" y="14" '
               'text-anchor="middle">Achieved FLOP/s (FLOP = 2 x MAC)</text>')
    # roofs
    for peak, cls, name in (
        (r.peak_flops, "roof", f"{r.peak_dtype} {r.peak_unit}-core peak {si(r.peak_flops, 'FLOP/s')}"),
        (r.vector_flops, "roof roof-vector", f"{r.dtype} CUDA-core peak {si(r.vector_flops, 'FLOP/s')}"),
    ):
        if cls != "roof" and peak == r.peak_flops:
            continue  # same unit (e.g. fp32 without TF32): one roof, not two on top of each other
        x0 = max(xmin, ymin / r.bandwidth)
        ridge = peak / r.bandwidth
        pts = [(x0, r.bandwidth * x0), (ridge, peak), (xmax, peak)]
        path = " ".join(f"{_f(ax.x(a))},{_f(ax.y(b))}" for a, b in pts)
        out.append(f'<polyline class="{cls}" points="{path}"><title>{esc(name)}</title></polyline>')
        out.append(f'<text class="roof-label" x="{W - MR - 4}" y="{_f(ax.y(peak) - 4)}" text-anchor="end">{esc(name)}</text>')
    rx = ax.x(r.ridge)
    out.append(f'<line class="ridge" x1="{_f(rx)}" x2="{_f(rx)}" y1="{MT}" y2="{H - MB}"/>')
    out.append(f'<text class="ridge-label" x="{_f(rx + 4)}" y="{H - MB - 6}">ridge {r.ridge:.3g} FLOP/B</text>')
    bw_label_x = max(xmin * 1.5, r.ridge / 300)
    out.append(f'<text class="roof-label" x="{_f(ax.x(bw_label_x))}" y="{_f(ax.y(r.bandwidth * bw_label_x) - 6)}">'
               f"{esc(si(r.bandwidth, 'B/s'))}</text>")
    # measured overlay first, so predicted circles stay on top for hovering
    for i, p in shown:
        t = measured.get(p.key)
        if not t:
            continue
        mx, my = ax.x(p.intensity), ax.y(min(max(p.flops / t, ymin), ymax))
        px, py = ax.x(p.intensity), ax.y(p.achieved_flops)
        out.append(f'<line class="measured-link" x1="{_f(px)}" y1="{_f(py)}" x2="{_f(mx)}" y2="{_f(my)}"/>')
        out.append(f'<path class="measured-pt" data-i="{i}" d="M{_f(mx)},{_f(my - 5)} l5,5 l-5,5 l-5,-5 z">'
                   f"<title>{esc(p.label)} measured {esc(seconds(t))}</title></path>")
    for i, p in shown:
        color = BOUND_COLORS.get(p.bound, BOUND_COLORS["none"])
        out.append(
            f'<circle class="pt" data-i="{i}" cx="{_f(ax.x(p.intensity))}" cy="{_f(ax.y(p.achieved_flops))}" '
            f'r="5" fill="{color}"><title>{esc(point_title(p, measured.get(p.key)))}</title></circle>'
        )
    out.append("</svg>")
    return "".join(out)


def _decade(d: int) -> str:
    return f"{10.0**d:g}" if -3 <= d <= 4 else f"1e{d}"


def memory_svg(
    timeline: Sequence[tuple[int, str, float]],
    *,
    capacity: float | None = None,
    measured: Sequence[tuple[int, float]] = (),
    events: int | None = None,
) -> str:
    """Allocated bytes over the step's events: an area per phase, the peak and the capacity.

    ``timeline``: (event index, phase, allocated bytes) in event order.
    """
    w, h = W, 260
    if not timeline:
        return ""
    n = max(events or 0, timeline[-1][0] + 1, *(i + 1 for i, _ in measured)) if measured else max(
        events or 0, timeline[-1][0] + 1)
    top = max([b for _, _, b in timeline] + [b for _, b in measured])
    if capacity and capacity < top * 1.6:
        top = max(top, capacity)
    top *= 1.08

    def x(i: float) -> float:
        return ML + i / max(n, 1) * (w - ML - MR)

    def y(b: float) -> float:
        return h - MB - b / top * (h - MT - MB)

    out = [f'<svg class="memory" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" '
           'aria-label="Memory timeline" xmlns="http://www.w3.org/2000/svg">',
           f'<rect x="{ML}" y="{MT}" width="{w - ML - MR}" height="{h - MT - MB}" class="plot-bg"/>']
    for k in range(5):
        b = top / 1.08 * k / 4
        out.append(f'<line class="grid" x1="{ML}" x2="{w - MR}" y1="{_f(y(b))}" y2="{_f(y(b))}"/>')
        out.append(f'<text class="tick" x="{ML - 4}" y="{_f(y(b) + 3)}" text-anchor="end">{esc(binary(b, 2))}</text>')
    # one filled area per contiguous phase run
    runs: list[list[tuple[int, str, float]]] = []
    for p in timeline:
        if runs and runs[-1][-1][1] == p[1]:
            runs[-1].append(p)
        else:
            if runs:
                runs[-1].append((p[0], runs[-1][-1][1], p[2]))  # close the gap to the next run
            runs.append([p])
    for run in runs:
        pts = [f"{_f(x(run[0][0]))},{_f(y(0))}"] + [f"{_f(x(i))},{_f(y(b))}" for i, _, b in run]
        pts.append(f"{_f(x(run[-1][0]))},{_f(y(0))}")
        out.append(f'<polygon class="mem-area phase-{esc(run[0][1])}" points="{" ".join(pts)}">'
                   f"<title>{esc(run[0][1])}</title></polygon>")
    peak_i, _, peak_b = max(timeline, key=lambda p: p[2])
    out.append(f'<circle class="mem-peak" cx="{_f(x(peak_i))}" cy="{_f(y(peak_b))}" r="4">'
               f"<title>predicted peak {esc(binary(peak_b))} at event {peak_i}</title></circle>")
    right = x(peak_i) > (w + ML) / 2  # label on the side with room
    out.append(f'<text class="roof-label" x="{_f(x(peak_i) + (-6 if right else 6))}" y="{_f(y(peak_b) + 14)}" '
               f'text-anchor="{"end" if right else "start"}">peak {esc(binary(peak_b))}</text>')
    if measured:
        path = " ".join(f"{_f(x(i))},{_f(y(b))}" for i, b in measured)
        out.append(f'<polyline class="mem-measured" points="{path}"><title>measured</title></polyline>')
    if capacity and capacity <= top:
        out.append(f'<line class="capacity" x1="{ML}" x2="{w - MR}" y1="{_f(y(capacity))}" y2="{_f(y(capacity))}"/>')
        out.append(f'<text class="roof-label" x="{w - MR - 4}" y="{_f(y(capacity) - 4)}" text-anchor="end">'
                   f"GPU memory {esc(binary(capacity))}</text>")
    out.append(f'<text class="axis-label" x="{(w + ML) / 2:.0f}" y="{h - 8}" text-anchor="middle">'
               "Op events through the step (forward, backward, optimizer)</text>")
    out.append("</svg>")
    return "".join(out)
