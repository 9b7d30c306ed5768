"""How far to trust a prediction: nnperf's error on the measured runs most like it.

A predicted step time is only as good as the model behind it, and that model is better on
some workloads than on others (within 10% on consumer-card CNN inference, 45% too fast on an
H200 over a cloud VM's host). So every prediction carries its *track record*: the median
error of today's model on the committed measurements of the runs most like it, with how
many there are and what they share. The runs are in ``nnperf/data/accuracy.json`` (package
data, so it works after ``pip install``): one row per measured run, nnperf's own GPU runs
(``validation/data/*/records-*.jsonl``) and the published single-GPU rows
(``validation/published/``), each re-predicted by the current model, with its traits and its
signed error, predicted / measured - 1. ``validation/accuracy_table.py --write`` rewrites it;
a test (``-m accuracy``) fails when the model has moved away from it.

Likeness is decided on traits, not numbers: the GPU, the model family, the precision,
training or inference, and what the prediction says bounds the step. Exact matches first;
with fewer than ``MIN_RUNS`` of them the match is relaxed one trait at a time, in ``LADDER``'s
order, from the trait that changes nnperf's error least to the one that changes it most:
the bound (a property of the prediction, not of the workload), then the precision to its
width (bf16 ~ fp16, fp32 ~ tf32), then the GPU to its architecture, then to its segment
(data-centre, consumer) and vendor, then the family. Training against inference, the
precision's width, the segment and the vendor are never relaxed: a host-bound
inference step or an AMD GPU says nothing about a CUDA training step. Where no run is left,
the record says so: nothing measured resembles the workload.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nnperf.analysis import Analysis
    from nnperf.hardware import GPU
    from nnperf.prediction import Prediction

TABLE_FILE = Path(__file__).parent / "data" / "accuracy.json"
TABLE_SCHEMA = "nnperf.accuracy-table/1"
REGENERATE = "python validation/accuracy_table.py --write"
#: Fewer runs than this at one level of likeness relax it to the next: one or two runs are an
#: anecdote, three a median that a single outlier cannot set.
MIN_RUNS = 3
#: Precision -> its width, the class a relaxed match compares: autocast in bf16 and fp16 run
#: the same tensor-core kernels at the same rate; TF32 and fp32 keep fp32 tensors.
PRECISION_WIDTH = {"fp32": "32-bit", "tf32": "32-bit", "bf16": "16-bit", "fp16": "16-bit"}
#: A GPU with no ``segment`` in its file (a user's ``--gpu-file``).
NO_SEGMENT = "other"
#: How a family reads in a sentence ("bf16 CNN training"); the others read as they are spelled.
_FAMILY_WORDS = {"cnn": "CNN", "mlp": "MLP"}


@dataclass(frozen=True)
class RunTraits:
    """What makes two runs alike for nnperf's error: where and how a step ran."""

    gpu: str | None  # catalog id; None for a user's GPU file or a what-if (--set)
    gpu_name: str
    vendor: str
    architecture: str
    segment: str  # schema.SEGMENTS or NO_SEGMENT
    family: str  # passes.family.FAMILIES
    precision: str  # fp32 | tf32 | bf16 | fp16 (or the dtype as traced: fp64, ...)
    mode: str  # train | inference
    bound: str  # the predicted step's bound: compute | memory | launch | host

    @property
    def width(self) -> str:
        return PRECISION_WIDTH.get(self.precision, self.precision)


@dataclass(frozen=True)
class MeasuredRun:
    """One row of the table: a measured run, its traits and today's model's signed error."""

    id: str
    source: str  # "nnperf-h200-sxm" (our harness), "published:dle-resnet50.toml"
    grade: str | None  # a published row's grade (faithful / approximate); None for ours
    traits: RunTraits
    error: float  # predicted / measured - 1: negative, predicted faster than measured

    def to_json(self) -> dict[str, Any]:
        t = self.traits
        return {"id": self.id, "source": self.source, "grade": self.grade, "gpu": t.gpu,
                "gpu_name": t.gpu_name, "vendor": t.vendor, "architecture": t.architecture,
                "segment": t.segment, "family": t.family, "precision": t.precision, "mode": t.mode,
                "bound": t.bound, "error": self.error}

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> MeasuredRun:
        traits = RunTraits(row["gpu"], row["gpu_name"], row["vendor"], row["architecture"], row["segment"],
                           row["family"], row["precision"], row["mode"], row["bound"])
        return cls(row["id"], row["source"], row.get("grade"), traits, float(row["error"]))


#: A trait by name, and how to read it off a run's traits.
Trait = tuple[str, Callable[[RunTraits], str | None]]


@dataclass(frozen=True)
class Likeness:
    """One level of the ladder: the traits compared (name, how to read it off a run)."""

    relaxed: tuple[str, ...]  # the traits no longer compared, cumulative
    compared: tuple[Trait, ...]

    def describe(self, t: RunTraits) -> str:
        """What the runs this level finds share with ``t``, in words:
        'H200 SXM 141GB, bf16 CNN training, host-bound', 'NVIDIA Hopper GPUs, 16-bit ...'."""
        names = {name for name, _ in self.compared}
        if "gpu" in names:
            where = t.gpu_name
        elif "architecture" in names:
            where = f"{t.vendor} {t.architecture} GPUs"
        else:
            where = _segment_words(t)
        precision = t.precision if "precision" in names else t.width
        family = _FAMILY_WORDS.get(t.family, t.family)
        what = f"{precision} {family} {_mode(t)}" if "family" in names else f"{precision} {_mode(t)} of any model family"
        bound = f"{t.bound}-bound" if "bound" in names else "any bound"
        return f"{where}, {what}, {bound}"


def _mode(t: RunTraits) -> str:
    return "training" if t.mode == "train" else t.mode


def _segment_words(t: RunTraits) -> str:
    return f"{'' if t.segment == NO_SEGMENT else t.segment + ' '}{t.vendor} GPUs"


def _ladder() -> tuple[Likeness, ...]:
    gpu: Trait = ("gpu", lambda t: t.gpu)
    vendor: Trait = ("vendor", lambda t: t.vendor)
    arch: Trait = ("architecture", lambda t: t.architecture)
    segment: Trait = ("segment", lambda t: t.segment)
    family: Trait = ("family", lambda t: t.family)
    precision: Trait = ("precision", lambda t: t.precision)
    width: Trait = ("width", lambda t: t.width)
    mode: Trait = ("mode", lambda t: t.mode)
    bound: Trait = ("bound", lambda t: t.bound)
    return (
        Likeness((), (gpu, family, precision, mode, bound)),
        Likeness(("bound",), (gpu, family, precision, mode)),
        Likeness(("bound", "precision"), (gpu, family, width, mode)),
        Likeness(("bound", "precision", "gpu"), (vendor, arch, family, width, mode)),
        Likeness(("bound", "precision", "gpu", "architecture"), (vendor, segment, family, width, mode)),
        Likeness(("bound", "precision", "gpu", "architecture", "family"), (vendor, segment, width, mode)),
    )


#: From exact to loosest; each level's runs include the previous level's.
LADDER = _ladder()


@dataclass(frozen=True)
class TrackRecord:
    """How nnperf did on the measured runs most like one prediction.

    ``median_abs_error`` and ``median_signed_error`` are fractions of the measured step
    time: the medians of |predicted / measured - 1| and of predicted / measured - 1 (the
    bias; negative: nnperf predicted those runs faster than they ran). ``n`` is 0 when
    nothing measured resembles the workload; then the errors are None. ``matched`` holds the
    traits the runs share with the workload (name -> value), ``relaxed`` those they were
    allowed to differ in."""

    n: int
    median_abs_error: float | None
    median_signed_error: float | None
    matched: tuple[tuple[str, str], ...]
    relaxed: tuple[str, ...]
    description: str
    sources: tuple[tuple[str, int], ...] = ()

    @property
    def found(self) -> bool:
        return self.n > 0

    def text(self) -> str:
        """One line for a terminal or a report: 'runs like this one: median error 45%, ...'."""
        if not self.found:
            return (f"runs like this one: none measured ({self.description}): nnperf has not been "
                    "checked on anything like this workload")
        assert self.median_abs_error is not None and self.median_signed_error is not None
        if abs(self.median_signed_error) < 0.005:  # prints as 0%
            bias = "no bias"
        else:
            way = "faster" if self.median_signed_error < 0 else "slower"
            bias = f"predicted {way} than measured (median {self.median_signed_error:+.0%})"
        return f"runs like this one: median error {self.median_abs_error:.0%} (n={self.n}: {self.description}), {bias}"

    def cell(self) -> str:
        """A table cell: '45% (n=14)', or 'none measured'."""
        return f"{self.median_abs_error:.0%} (n={self.n})" if self.found else "none measured"

    def to_json(self) -> dict[str, Any]:
        return {"median_abs_error": self.median_abs_error, "median_signed_error": self.median_signed_error,
                "n": self.n, "matched": dict(self.matched), "relaxed": list(self.relaxed),
                "runs_like": self.description, "sources": dict(self.sources)}


def track_record(traits: RunTraits, runs: Sequence[MeasuredRun] | None = None) -> TrackRecord:
    """The track record of a workload with ``traits`` among ``runs`` (the committed table by
    default): the first level of ``LADDER`` with ``MIN_RUNS`` runs or more; else the loosest
    level with any; else a record saying that nothing measured is like it."""
    runs = load_table() if runs is None else runs
    found: list[MeasuredRun] = []
    level = LADDER[-1]
    for level in LADDER:
        found = [r for r in runs if all(read(r.traits) == read(traits) for _, read in level.compared)]
        if len(found) >= MIN_RUNS:
            break
    matched = tuple((name, str(read(traits))) for name, read in level.compared)
    if not found:
        kept = f"no {traits.width} {_mode(traits)} run on {_segment_words(traits)}"
        return TrackRecord(0, None, None, matched, level.relaxed, kept)
    errors = [r.error for r in found]
    sources = Counter(r.source for r in found)
    return TrackRecord(len(found), statistics.median(abs(e) for e in errors), statistics.median(errors),
                       matched, level.relaxed, level.describe(traits), tuple(sorted(sources.items())))


@lru_cache(maxsize=4)
def load_table(path: Path = TABLE_FILE) -> tuple[MeasuredRun, ...]:
    """The committed table's runs (read once)."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    if doc.get("schema") != TABLE_SCHEMA:
        raise ValueError(f"{path}: schema {doc.get('schema')!r}, expected {TABLE_SCHEMA!r}; rebuild it: {REGENERATE}")
    return tuple(MeasuredRun.from_json(row) for row in doc["runs"])


def table_text(runs: Sequence[MeasuredRun]) -> str:
    """The table file's text: one run per line, so a regeneration's diff shows each run that moved."""
    head = {"schema": TABLE_SCHEMA, "regenerate": REGENERATE,
            "error": "predicted / measured - 1 of the step time, re-predicted with the model of this commit"}
    fields = "".join(f" {json.dumps(k)}: {json.dumps(v)},\n" for k, v in head.items())
    rows = ",\n".join("  " + json.dumps(r.to_json()) for r in runs)
    return "{\n" + fields + ' "runs": [\n' + rows + "\n ]\n}\n"


def gpu_traits(gpu: GPU) -> dict[str, Any]:
    """The GPU's traits: a catalog GPU by its id; a user's file or a what-if by its
    architecture at most (its numbers are not the measured card's)."""
    catalog = gpu.origin.startswith("built-in") and not gpu.overrides
    return {"gpu": gpu.id if catalog else None, "gpu_name": gpu.name, "vendor": gpu.vendor,
            "architecture": gpu.architecture, "segment": gpu.segment or NO_SEGMENT}


def precision_of(analysis: Analysis, tf32_matmul: bool) -> str:
    """The step's precision: the autocast dtype, else the parameters' (``--dtype`` or the
    model's own), fp32 reading as tf32 where matmuls may use TF32."""
    precision = analysis.options.amp or str(analysis.config["dtype"])
    return "tf32" if precision == "fp32" and tf32_matmul else precision


def workload_family(analysis: Analysis) -> str:
    """A built-in model's stated family; any other model's read from its trace
    (``passes.family.trace_family``)."""
    from nnperf.passes.family import trace_family
    from nnperf.zoo import find_model

    spec = find_model(analysis.model)
    if spec is not None and spec.name == analysis.model:  # not a user class called "MLP"
        return spec.family
    return trace_family(analysis.trace, analysis.ops)


def prediction_traits(p: Prediction) -> RunTraits:
    return RunTraits(**gpu_traits(p.gpu), family=workload_family(p.analysis),
                     precision=precision_of(p.analysis, p.timing.tf32_matmul), mode=p.analysis.trace.mode,
                     bound=str(p.step.bound))
