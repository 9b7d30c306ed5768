"""nnperf plan's step time against published multi-GPU training measurements.

    python validation/plan_compare.py [--rows FILE] [--only ID_PREFIX] [--json]

Every reproducible row of ``validation/multi_gpu/rows.toml`` (or ``--rows``: e.g.
``validation/multi_gpu/megatron_runs.toml``, Megatron-LM's data parallelism beside tensor and
pipeline parallelism) is predicted on the layout the
source states (``search.plan.evaluate``: the rank roles traced with the real engines, no search)
on its GPU and cluster, and compared on the source's metric (iteration time, or tokens per
second per GPU); rows nnperf cannot build are counted with the reason. Each row has a grade:
faithful (the run as the source describes it, engine included) or approximate (something it
ran is not modelled; its ``grade_reason`` and the section comments of rows.toml say what).
Printed: each row's grade, measured and predicted value and error, the median |error| overall,
per grade and per source, and per group of rows of one model the Spearman rank correlation
between the measured and predicted ordering (a group of two is +1 when the faster one is
predicted faster, -1 otherwise), and how many of the layouts are planned to fit their GPUs
(each ran as published, so one planned not to fit is the plan's memory error, named).
Targets (issue 18): median |error| <= 10%, Spearman >= 0.9. Nothing here is tuned to the rows.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from dataclasses import fields
from pathlib import Path

import tomllib

from nnperf.errors import NnperfError
from nnperf.hardware.catalog import load_gpu
from nnperf.hardware.cluster import load_cluster
from nnperf.layout import Execution
from nnperf.request import ModelRequest
from nnperf.search.plan import evaluate
from nnperf.search.plan.rank import RoleCache, layers_of
from nnperf.trace.options import TraceOptions

ROWS = Path(__file__).parent / "multi_gpu" / "rows.toml"
TARGET_MEDIAN, TARGET_SPEARMAN = 0.10, 0.9
_EXECUTION = {f.name for f in fields(Execution)}
#: What a row's ``metric`` names, read off the plan of its layout.
METRICS = {"step_time_s": lambda planned, execution: planned.step_s,
           "tokens_per_s_per_gpu": lambda planned, execution: planned.throughput / execution.world}


def predict(row: dict) -> tuple[float, dict]:
    """The row's metric as nnperf predicts it, and the planned layout's JSON (its
    ``reserved_bytes``: the peak the caching allocator reserves, what torchtitan logs)."""
    if row["metric"] not in METRICS:  # before any trace
        raise ValueError(f"{row['id']}: unknown metric {row['metric']} (valid: {', '.join(METRICS)})")
    unknown = sorted(set(row["execution"]) - _EXECUTION)
    if unknown:  # said, not silently dropped: the row is planned without them
        print(f"{row['id']:<36} note: execution fields not in nnperf.layout.Execution, ignored: "
              f"{', '.join(unknown)}", file=sys.stderr, flush=True)
    execution = Execution(**{k: v for k, v in row["execution"].items() if k in _EXECUTION})
    gpu = load_gpu(row["gpu"], overrides=row.get("gpu_set"))
    cluster = load_cluster(row["cluster"])
    overrides = dict(row.get("overrides", {}))
    local_batch = execution.micro_batch * execution.grad_accum if execution.pipeline > 1 else execution.micro_batch
    request = ModelRequest(row["model"], batch=local_batch, seq_len=row.get("seq"), overrides=overrides)
    options = TraceOptions(amp=row.get("amp"), dtype=row.get("dtype"), sdpa=row.get("sdpa", "fused"),
                           loss=row.get("loss", "eager"), clip_grad_norm=row.get("clip_grad_norm"),
                           fp8=row.get("fp8", False), pointwise=row.get("pointwise", "eager"))
    planned = evaluate(request, options, execution, gpu, cluster, layers=layers_of(request), cache=RoleCache())
    return METRICS[row["metric"]](planned, execution), planned.to_json()


def spearman(measured: list[float], predicted: list[float]) -> float:
    """Spearman's rho of two equally long lists (average ranks for ties)."""
    def ranks(values: list[float]) -> list[float]:
        order = sorted(range(len(values)), key=lambda i: values[i])
        out = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2
            i = j + 1
        return out

    a, b = ranks(measured), ranks(predicted)
    n = len(a)
    mean_a, mean_b = sum(a) / n, sum(b) / n
    cov = sum((x - mean_a) * (y - mean_b) for x, y in zip(a, b, strict=True))
    var = (sum((x - mean_a) ** 2 for x in a) * sum((y - mean_b) ** 2 for y in b)) ** 0.5
    return cov / var if var else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=Path, default=ROWS, help="the rows file (default: rows.toml)")
    parser.add_argument("--only", default="", help="rows whose id starts with this")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    rows = [r for r in tomllib.loads(args.rows.read_text())["row"] if r["id"].startswith(args.only)]
    results, skipped, refused, failed = [], [], [], []
    for row in rows:
        if not row.get("reproducible", True):
            skipped.append((row["id"], row["why_not"]))
            continue
        start = time.perf_counter()
        try:
            value, layout = predict(row)
        except NnperfError as exc:  # a layout nnperf cannot build: counted, the rest still run
            refused.append((row["id"], str(exc)))
            if not args.json:
                print(f"{row['id']:<36} refused: {exc}", flush=True)
            continue
        except Exception as exc:  # a bug (nnperf's or the row's): said, and the other rows still run
            failed.append((row["id"], f"{type(exc).__name__}: {exc}"))
            print(f"{row['id']:<36} FAILED: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            continue
        error = value / row["measured"] - 1
        results.append({"id": row["id"], "group": row["group"], "grade": row["grade"],
                        "source": re.split(r"[,(;]", row["source"])[0].strip(),
                        "metric": row["metric"], "measured": row["measured"], "predicted": value,
                        "error": error, "seconds": time.perf_counter() - start, "layout": layout["layout"],
                        "planned_memory_gib": layout["memory_bytes"] / 2**30, "fits": layout["fits"]})
        memory = _memory(row, layout)
        results[-1].update(memory)
        if not args.json:
            print(f"{row['id']:<36} {row['grade']:<12} {row['metric']:<22} measured {row['measured']:>9.2f}  "
                  f"predicted {value:>9.2f}  "
                  f"error {error:+7.1%}  ({results[-1]['seconds']:.0f} s to predict)", flush=True)
            if memory:
                print(f"{'':<36} {'':<12} {'memory (max reserved)':<22} measured {memory['memory_measured_gib']:>6.2f} GiB"
                      f"  predicted {memory['memory_predicted_gib']:>6.2f} GiB  error {memory['memory_error']:+7.1%}")
    summary = summarize(results)
    if args.json:
        print(json.dumps({"rows": results, "not_reproducible": skipped, "refused": refused, "failed": failed,
                          **summary}, indent=2))
        return 1 if failed else 0
    for row_id, why in skipped:
        print(f"{row_id:<36} not reproducible: {why}")
    print(f"\nmedian |error| over {len(results)} rows: {summary['median_abs_error']:.1%} "
          f"(target <= {TARGET_MEDIAN:.0%})" + (f"; {len(refused)} of {len(results) + len(refused) + len(failed)} rows "
                                              f"refused" if refused else "")
          + (f"; {len(failed)} rows FAILED (an error, not a refusal: see above)" if failed else ""))
    for grade, median in summary["median_by_grade"].items():
        print(f"  {grade} rows: median |error| {median:.1%}")
    for source, median in summary["median_by_source"].items():
        print(f"  {source}: median |error| {median:.1%}")
    for group, rho in summary["spearman_by_group"].items():
        verdict = "ok" if rho >= TARGET_SPEARMAN else "MISS"
        print(f"Spearman {group}: {rho:+.2f} (target >= {TARGET_SPEARMAN}) {verdict}")
    print(f"fit: {summary['fits']} of {len(results)} layouts, each run as published, are planned to fit their GPUs"
          + (f"; not: {', '.join(summary['not_fitting'])}" if summary["not_fitting"] else ""))
    memory = [r for r in results if "memory_error" in r]
    if memory:
        print(f"memory: median |error| {statistics.median(abs(r['memory_error']) for r in memory):.1%} over "
              f"{len(memory)} rows that state it (no target: a check of the per-GPU peak the plan reports)")
    return 1 if failed else 0


def _memory(row: dict, layout: dict) -> dict:
    """The row's logged peak memory (``measured_memory_gib``: torchtitan's "memory:", i.e.
    ``torch.cuda.max_memory_reserved()``) against the plan's reserved bytes; empty if not stated."""
    if "measured_memory_gib" not in row:
        return {}
    predicted = layout["reserved_bytes"] / 2**30
    return {"memory_measured_gib": row["measured_memory_gib"], "memory_predicted_gib": predicted,
            "memory_error": predicted / row["measured_memory_gib"] - 1}


def summarize(results: list[dict]) -> dict:
    """The medians, the orderings and the layouts planned to fit, of the predicted rows."""
    if not results:
        return {"median_abs_error": float("nan"), "median_by_grade": {}, "median_by_source": {},
                "spearman_by_group": {}, "fits": 0, "not_fitting": []}
    by_grade: dict[str, list[float]] = {}
    by_source: dict[str, list[float]] = {}
    by_group: dict[str, list[dict]] = {}
    for r in results:
        by_grade.setdefault(r["grade"], []).append(abs(r["error"]))
        by_source.setdefault(r["source"], []).append(abs(r["error"]))
        by_group.setdefault(r["group"], []).append(r)
    spearmans = {g: spearman([r["measured"] for r in rs], [r["predicted"] for r in rs])
                 for g, rs in by_group.items() if len(rs) > 1}
    return {"median_abs_error": statistics.median(abs(r["error"]) for r in results),
            "median_by_grade": {g: statistics.median(v) for g, v in sorted(by_grade.items())},
            "median_by_source": {s: statistics.median(v) for s, v in by_source.items()},
            "spearman_by_group": spearmans,
            # every row ran as published: a layout planned not to fit is a memory error of the plan
            "fits": sum(1 for r in results if r["fits"]),
            "not_fitting": [f"{r['id']} ({r['planned_memory_gib']:.1f} GiB)" for r in results if not r["fits"]]}


if __name__ == "__main__":
    sys.exit(main())
