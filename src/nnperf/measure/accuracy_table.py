"""The table behind every prediction's track record (``nnperf.accuracy``), built from the
committed measurements with the current model.

Two sources, each re-predicted exactly as its error table is (so the track record and the
committed error tables never disagree): nnperf's own GPU runs (``validation/data/<gpu>/``,
the datasheet prediction of ``validation.repredict``) and the published single-GPU training and
inference rows (``validation/published/``, ``published.records``). GEMM and device-memory
rows are left out: they are not a predicted step time. ``validation/accuracy_table.py``
writes the table into the package and checks the committed one against a fresh build.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from nnperf.accuracy import MeasuredRun, RunTraits, gpu_traits

#: Digits of the stored error (a fraction): 0.01 percentage points, far below what any
#: model change moves and above the last-bit noise of re-predicting on another machine.
ERROR_DIGITS = 4
#: How far a fresh error may sit from the committed one and still be the same model: one unit
#: of the last stored digit (a value on a rounding boundary may round either way).
TOLERANCE = 10.0 ** -ERROR_DIGITS * 1.001
PUBLISHED_PRECISION = {"amp-fp16": "fp16", "amp-bf16": "bf16"}
#: How a published row's ``MeasuredRun.source`` starts (then the rows' file).
PUBLISHED_SOURCE = "published:"


def _error(predicted: float, measured: float) -> float:
    return round(predicted / measured - 1.0, ERROR_DIGITS)


def _traits(gpu_id: str, family: str, precision: str, train: bool, bound: str) -> RunTraits:
    from nnperf.hardware import load_gpu

    return RunTraits(**gpu_traits(load_gpu(gpu_id)), family=family, precision=precision,
                     mode="train" if train else "inference", bound=bound)


def harness_runs(folder: Path, records: list[dict[str, Any]] | None = None) -> list[MeasuredRun]:
    """nnperf's own runs of one GPU (a ``validation/data/<gpu>`` folder), re-predicted
    (``records``: the folder's records already re-predicted on their GPU by
    ``validation.repredict``, where the caller has them: the folder's error tables and this
    table are then one prediction, not two)."""
    from nnperf.measure.validation import Config, family_of, load_records, repredict

    out = []
    chosen = [(r, Config.from_record(r)) for r in (load_records(folder) if records is None else records)
              if r.get("fits", True) and "measured_step_time_s" in r and not r.get("tiny")]
    # a configuration measured in more than one session is a run per session: named by its file
    times = Counter(config.name for _, config in chosen)
    for record, config in chosen:
        if records is None:
            repredict(record, record["gpu"])
        measured = record["measured_step_time_s"]
        measured = measured["median"] if isinstance(measured, dict) else measured
        traits = _traits(record["gpu"], family_of(config.model), config.precision, config.train,
                         record["predicted_bound"])
        name = config.name if times[config.name] == 1 else f"{config.name}@{Path(record['_file']).stem}"
        out.append(MeasuredRun(name, f"nnperf-{folder.name}", None, traits,
                               _error(record["predicted_step_time_s"], measured)))
    return out


def published_runs(folder: Path, recs: list[dict[str, Any]] | None = None) -> list[MeasuredRun]:
    """The published single-GPU training and inference rows nnperf can build, re-predicted
    (``recs``: ``published.records`` of the folder's rows where the caller has them already:
    the rows' error tables and this table are then one prediction, not minutes of CPU twice)."""
    from nnperf.measure.published import load_rows, records, zoo_model
    from nnperf.measure.validation import family_of

    rows = {row["id"]: row for row in load_rows(folder) if row.get("task") in ("training", "inference")}
    out = []
    for rec in records(rows.values()) if recs is None else recs:
        if "not_reproducible" in rec or rec["config"] not in rows:
            continue
        row = rows[rec["config"]]
        precision = PUBLISHED_PRECISION.get(row["nnperf_precision"], row["nnperf_precision"])
        traits = _traits(row["gpu_catalog"], family_of(zoo_model(row) or ""), precision,
                         row["task"] == "training", rec["predicted_bound"])
        out.append(MeasuredRun(row["id"], f"{PUBLISHED_SOURCE}{row['file']}", row.get("grade"), traits,
                               _error(rec["predicted_step_time_s"], rec["measured_step_time_s"])))
    return out


def build_table(validation: Path) -> list[MeasuredRun]:
    """Every run of the table, from a checkout's ``validation/`` folder: each GPU data folder
    that carries a committed error baseline (``data/*/baseline.json``), then the published rows."""
    runs = []
    for baseline in sorted((validation / "data").glob("*/baseline.json")):
        runs += harness_runs(baseline.parent)
    return runs + published_runs(validation / "published")


def is_published(run: MeasuredRun) -> bool:
    """A published row's run (``published_runs``), not one of nnperf's own (``harness_runs``)."""
    return run.source.startswith(PUBLISHED_SOURCE)


def stale_rows(committed: Iterable[MeasuredRun], fresh: Iterable[MeasuredRun]) -> list[str]:
    """What differs between the committed table and a fresh build: runs only in one, traits
    that changed, errors further apart than ``TOLERANCE``."""
    old = {r.id: r for r in committed}
    new = {r.id: r for r in fresh}
    out = [f"{i}: in the table, not built now" for i in old if i not in new]
    out += [f"{i}: built now, not in the table" for i in new if i not in old]
    for i, fresh_run in new.items():
        was = old.get(i)
        if was is None:
            continue
        if was.traits != fresh_run.traits:
            out.append(f"{i}: traits {_diff(was.traits, fresh_run.traits)}")
        if abs(was.error - fresh_run.error) > TOLERANCE:
            out.append(f"{i}: error {was.error:+.4f} in the table, {fresh_run.error:+.4f} now")
    return out


def _diff(a: RunTraits, b: RunTraits) -> str:
    return ", ".join(f"{k} {v!r} -> {getattr(b, k)!r}" for k, v in vars(a).items() if getattr(b, k) != v)
