"""Each report section's data, computed once per prediction and read by every renderer.

The terminal tables (``prediction_tables``), the HTML page and notebook cells
(``report.html``) and the page's JSON data island all render these records; a renderer
formats, it never sums, joins, mutates a result or looks a GPU up. A measurement is matched
to a prediction by the GPU id resolved when it was read (``Measured.gpu_id``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from nnperf.kernels.gemm import GemmEstimate
from nnperf.passes.estimates import Estimates
from nnperf.passes.gemms import Gemm
from nnperf.passes.memory import MemoryReport
from nnperf.passes.memory.capacity import MemoryFit
from nnperf.prediction import Prediction
from nnperf.report.roofline import RooflinePoint, Roofs, cut, roofline_points, roofs
from nnperf.units import si

if TYPE_CHECKING:
    from nnperf.report.html.measured import Measured

#: Pass as ``memory`` to have the report run the memory model itself (when it is installed).
AUTO = "auto"


def memory_for(prediction: Prediction) -> tuple[MemoryReport | None, str]:
    """The prediction's memory report (computed once, shared with its totals and the fit
    verdict): (MemoryReport or None, why not)."""
    try:
        return prediction.memory, ""
    except Exception as err:  # a report should still come out if one pass fails
        return None, f"the memory model failed: {type(err).__name__}: {err}"


# ---- summary -------------------------------------------------------------------------------
def mfu_label(totals: dict) -> str:
    """What MFU divides: forward+backward FLOPs (not the optimizer's; an inference pass has
    only forward ones: ``mfu_flops_of``) by the peak of the math the matrix kernels ran
    (``mfu_math``: e.g. tf32 for fp32 convolutions under cuDNN's default, bf16-cuda-core for
    GEMVs; several modes, e.g. tf32+fp32, give their FLOP-weighted peak)."""
    math = totals["mfu_math"]
    weighted = " FLOP-weighted" if "+" in math else ""
    return (f"MFU ({totals['mfu_flops_of']} FLOPs / {math}{weighted} peak "
            f"{si(totals['mfu_peak_flops'], 'FLOP/s')})")


# ---- module and op time (terminal tables, JSON rows) ---------------------------------------
def module_times(p: Prediction, depth: int | None) -> list[tuple[Any, Estimates]]:
    """(module row, its timed tally) in tree order, rows without timed ops left out."""
    tallies = p.by_module(depth)
    return [(row, tallies[row.name]) for row in p.analysis.modules(depth) if row.name in tallies]


def op_times(p: Prediction, limit: int | None = None) -> list[tuple[str, Estimates]]:
    """(aten op, its timed tally), slowest first."""
    return list(p.by_op().items())[:limit]


# ---- GEMMs ---------------------------------------------------------------------------------
@dataclass
class GemmGroup:
    """GEMMs of one shape, phase and role (a 48-layer model repeats each shape 48 times)."""

    gemm: Gemm  # the first of the group
    estimate: GemmEstimate
    count: int = 0
    time_s: float = 0.0
    modules: list[str] = field(default_factory=list)  # the first three


def gemm_groups(prediction: Prediction) -> list[GemmGroup]:
    """The timed GEMMs grouped by shape, slowest group first."""
    groups: dict[tuple, GemmGroup] = {}
    for t in prediction.step.ops:
        for gt in t.gemms:
            g = gt.gemm
            group = groups.get(g.shape_key)
            if group is None:
                group = groups[g.shape_key] = GemmGroup(g, gt.estimate)
            group.count += 1
            group.time_s += gt.estimate.time_s
            if len(group.modules) < 3 and g.module not in group.modules:
                group.modules.append(g.module)
    return sorted(groups.values(), key=lambda r: -r.time_s)


# ---- per-layer memory ----------------------------------------------------------------------
def layer_memory(prediction: Prediction, memory: MemoryReport | None, depth: int) -> tuple[dict[str, float], str]:
    """Bytes per layer group: weights plus activations kept for backward (or layer outputs)."""
    trace = prediction.analysis.trace
    out: dict[str, float] = defaultdict(float)
    for sid, pname in trace.param_storages.items():
        owner = pname.rsplit(".", 1)[0] if "." in pname else ""
        out[cut(owner, depth)] += trace.storages[sid].nbytes
    if memory is not None and memory.saved_activations:
        for module, nbytes in memory.saved_activations.items():
            out[cut(module, depth)] += nbytes
        return out, "weights + activations kept for backward"
    for module, nbytes in trace.module_output_bytes.items():
        if module and cut(module, depth) == module:  # a group's own output, not its children's
            out[module] += nbytes
    return out, "weights + layer outputs (memory model not available)"


# ---- one GPU's report ----------------------------------------------------------------------
@dataclass
class Run:
    """One GPU's prediction with every section's data the page shows about it."""

    prediction: Prediction
    depth: int
    by: str
    memory: MemoryReport | None = None
    memory_note: str = ""
    measured: Measured | None = None
    points: list[RooflinePoint] = field(init=False)
    layers: list[RooflinePoint] = field(init=False)
    roofs: Roofs = field(init=False)
    totals: dict[str, Any] = field(init=False)
    gemms: list[GemmGroup] = field(init=False)
    layer_memory: dict[str, float] = field(init=False)
    layer_memory_what: str = field(init=False)

    def __post_init__(self) -> None:
        self.points = roofline_points(self.prediction, by=self.by, depth=self.depth)
        self.layers = (
            self.points if self.by == "layer" else roofline_points(self.prediction, by="layer", depth=self.depth)
        )
        self.roofs = roofs(self.prediction)
        self.totals = self.prediction.totals
        self.gemms = gemm_groups(self.prediction)
        self.layer_memory, self.layer_memory_what = layer_memory(self.prediction, self.memory, self.depth)

    @property
    def gpu_name(self) -> str:
        return self.prediction.gpu.name

    def measured_times(self) -> dict[str, float]:
        return dict(self.measured.module_time_s) if self.measured else {}

    def peak_memory(self) -> float | None:
        if self.memory is None:
            return None
        return self.memory.device_total or self.memory.peak_reserved or self.memory.peak_allocated

    @property
    def fit(self) -> MemoryFit | None:
        """The memory card's verdict: the report's memory model against the GPU's memory."""
        peak = self.peak_memory()
        return None if peak is None else MemoryFit.on(peak, self.prediction.gpu)

    def to_json(self) -> dict[str, Any]:
        measured = self.measured_times()
        return {
            "gpu": self.gpu_name,
            "roofs": self.roofs.to_json(),
            "points": [{**p.to_json(), "measured_s": measured.get(p.key)} for p in self.points],
            "totals": self.totals,
        }


def make_runs(predictions: list[Prediction], memory: Any, measured: Measured | None, depth: int,
              by: str) -> list[Run]:
    """One ``Run`` per prediction. A memory report given here is attached to a copy of the
    prediction (its totals' fit verdict then uses it, not a second replay); the caller's
    prediction is left as it was."""
    runs = []
    for p in predictions:
        if memory == AUTO:
            mem, note = memory_for(p)
        else:
            mem, note = memory, ("" if memory is not None else "no memory prediction was given")
            if isinstance(mem, MemoryReport) and p.memory_report is None:
                p = replace(p, memory_report=mem)
        # a measurement belongs to one GPU; overlay it only where it matches (or says nothing)
        m = measured if measured and (len(predictions) == 1 or measured.matches(p.gpu)) else None
        runs.append(Run(p, depth=depth, by=by, memory=mem, memory_note=note, measured=m))
    return runs


# ---- advice --------------------------------------------------------------------------------
@dataclass
class AdviceRow:
    """One advice item as every renderer shows it (numbers; the renderers format them)."""

    rank: int | None  # None: gains nothing, or not predicted
    name: str
    title: str
    change: str
    before_s: float
    after_s: float | None
    gain_s: float | None
    gain_share: float | None
    throughput_before: float
    throughput_after: float | None
    throughput_unit: str
    memory_before: float | None
    memory_after: float | None
    fits: bool | None
    bound: str
    layers: list[str]
    assumptions: list[str]
    note: str = ""  # an error, or why it is not predicted
    usd_per_million: float | None = None  # GPU rows: price of a million samples there
    given_usd_per_million: float | None = None  # ... and on the GPU as given


def advice_rows(advice: Any) -> list[AdviceRow]:
    """Code changes: ranked items first, then those that gain nothing, then those not predicted
    (the other GPUs are ``advice_gpu_rows``)."""
    rows = []
    groups = ((advice.items, True), (advice.nothing, False), (advice.unpredicted, False))
    for items, ranked in groups:
        for i, item in enumerate(items, 1):
            rows.append(_advice_row(item, i if ranked else None))
    return rows


def advice_gpu_rows(advice: Any) -> list[AdviceRow]:
    """The same step on the other catalog GPUs, fastest first, with the price of a million
    samples where the step fits and a price is known."""
    return [_advice_row(item, i) for i, item in enumerate(getattr(advice, "gpus", []), 1)]


#: A change that makes the step slower than this factor reads as "11.4x slower": as a share of
#: the step saved it would be "-1042.8%", which nobody reads as eleven times the time.
SLOWER_AS_FACTOR = 2.0


def share_text(share: float) -> str:
    """A gain as a share of the step, '+12.3%' or '-40.0%'; a slowdown by more than
    ``SLOWER_AS_FACTOR`` as the factor, '11.4x slower' (the step takes 1 - share times as long)."""
    factor = 1.0 - share
    if factor > SLOWER_AS_FACTOR:
        return f"{factor:.1f}x slower" if factor < 100 else f"{factor:,.0f}x slower"
    return f"{share:+.1%}"


def gpus_not_compared(advice: Any) -> list[str]:
    """The catalog GPUs the other-GPU table leaves out, one line per reason: 'mi250x, mi300x:
    AMD GPU: ...', so a GPU missing from the table is not read as one that lost."""
    by_reason: dict[str, list[str]] = {}
    for gpu, why in getattr(advice, "gpus_not_compared", []):
        by_reason.setdefault(why, []).append(gpu)
    return [f"{', '.join(ids)}: {why}" for why, ids in by_reason.items()]


def _advice_row(item: Any, rank: int | None) -> AdviceRow:
    after = item.after
    note = item.error or ("" if after is not None else "gain not predicted: see assumptions")
    extra = item.candidate.extra
    return AdviceRow(
        rank=rank, name=item.name, title=item.candidate.title,
        change=item.candidate.how, before_s=item.before.step_s,
        after_s=after.step_s if after else None, gain_s=item.gain_s, gain_share=item.gain_share,
        throughput_before=item.before.throughput, throughput_after=after.throughput if after else None,
        throughput_unit=item.before.throughput_unit, memory_before=item.before.peak_bytes,
        memory_after=after.peak_bytes if after else None, fits=after.fits if after else None,
        bound=item.bound_move, layers=item.layers, assumptions=item.candidate.assumptions, note=note,
        usd_per_million=extra.get("usd_per_million_samples"),
        given_usd_per_million=extra.get("given_gpu_usd_per_million_samples"),
    )
