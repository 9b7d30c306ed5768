"""The answer of ``nnperf advise``: ranked items, the changes checked that gain nothing, and
the batch curve. One object for the Python API, the terminal, ``--json`` and the HTML page."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nnperf.search.advise.batch import Accumulation
from nnperf.search.advise.change import Candidate, Outcome

SCHEMA_VERSION = "nnperf.advice/1"
#: A gain below this share of the step is "gains nothing" (within the model's resolution).
NOTHING = 0.005


@dataclass
class AdviceItem:
    """One change with its prediction beside the workload as given."""

    candidate: Candidate
    before: Outcome
    after: Outcome | None  # None: not predicted (``error`` or the model cannot cost it)
    error: str = ""

    @property
    def name(self) -> str:
        return self.candidate.name

    @property
    def gain_s(self) -> float | None:
        """Time saved per step of the given batch (per-sample times, so a batch change compares)."""
        if self.after is None:
            return None
        return (self.before.per_sample_s - self.after.per_sample_s) * self.before.samples

    @property
    def gain_share(self) -> float | None:
        g = self.gain_s
        return None if g is None else g / self.before.step_s

    @property
    def speedup(self) -> float | None:
        if self.after is None or not self.after.per_sample_s:
            return None
        return self.before.per_sample_s / self.after.per_sample_s

    @property
    def bound_move(self) -> str:
        if self.after is None:
            return ""
        b, a = self.before.bound, self.after.bound
        return b if a == b else f"{b} -> {a}"

    @property
    def layers(self) -> list[str]:
        if self.after is not None and self.after.touched:
            return list(self.after.touched)
        return self.candidate.layers

    @property
    def helps(self) -> bool:
        share = self.gain_share
        return share is not None and share > NOTHING

    @property
    def ranked(self) -> bool:
        """Whether the item ranks as a gain: it saves time and the step still fits (a batch
        that needs 89,790 TiB is faster per sample, and of no use)."""
        return self.helps and self.after is not None and self.after.fits is not False

    def to_json(self) -> dict[str, Any]:
        c = self.candidate
        doc = {
            "name": c.name, "family": c.family, "title": c.title, "change": c.how,
            "layers": self.layers, "assumptions": c.assumptions, "predicted": self.after is not None,
            "before": self.before.to_json(), "after": self.after.to_json() if self.after else None,
            "gain_s": self.gain_s, "gain_share": self.gain_share, "speedup": self.speedup, "ranked": self.ranked,
            "bound": self.bound_move, "notes": list(self.after.notes) if self.after else [],
        }
        if self.error:
            doc["error"] = self.error
        if c.extra:
            doc["extra"] = c.extra
        return doc


@dataclass
class Advice:
    model: str
    gpu: str
    config: dict[str, Any]
    base: Outcome
    items: list[AdviceItem]  # code changes that gain, best first
    nothing: list[AdviceItem]  # code changes predicted to gain nothing (or lose)
    unpredicted: list[AdviceItem]  # offered, gain not predicted (or failed)
    # The same step on other GPUs: a purchase, not a code change, so ranked on its own
    # (fastest first) and never mixed into the ranking of code changes.
    gpus: list[AdviceItem] = field(default_factory=list)
    checked: list[tuple[str, str]] = field(default_factory=list)  # (name, why nothing to change)
    curve: dict[int, Outcome] = field(default_factory=dict)  # batch -> outcome
    largest_batch: int | None = None
    knee: int | None = None
    accumulation: Accumulation | None = None  # --global-batch reached by gradient accumulation
    combination: AdviceItem | None = None  # --apply
    valid_names: list[str] = field(default_factory=list)
    prediction: Any = field(default=None, repr=False)  # the given workload's Prediction (reports)
    model_label: str = ""  # the model as headers name it, -O changes included (``Analysis.label``)
    host: dict[str, Any] = field(default_factory=dict)  # ``DeviceProfile.host_json``: the host CPU timed
    gpus_not_compared: list[tuple[str, str]] = field(default_factory=list)  # (catalog id, why)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_VERSION, "model": self.model, "gpu": self.gpu, "config": self.config, **self.host,
            "before": self.base.to_json(),
            "track_record": self.prediction.track_record.to_json() if self.prediction is not None else None,
            "items": [i.to_json() for i in self.items],
            "gains_nothing": [i.to_json() for i in self.nothing],
            "not_predicted": [i.to_json() for i in self.unpredicted],
            "gpus": [i.to_json() for i in self.gpus],
            "gpus_not_compared": [{"gpu": g, "why": w} for g, w in self.gpus_not_compared],
            "already_done": [{"name": n, "why": w} for n, w in self.checked],
            "batch_curve": [{"batch": b, **o.to_json()} for b, o in sorted(self.curve.items())],
            "largest_batch": self.largest_batch, "knee": self.knee, "accumulation": self.accumulation.to_json() if self.accumulation else None,
            "combination": self.combination.to_json() if self.combination else None,
            "valid_names": self.valid_names,
        }
