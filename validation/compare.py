"""Compare committed measurements with nnperf's current predictions: the error table.

    python validation/compare.py validation/results/h100 [--gpu h100-sxm] [--recorded] [--json]

By default each record's configuration is predicted again with the current code (so the
table tracks the model as it changes); ``--recorded`` uses the predictions stored in the
records instead. Errors are absolute percentage errors of the step time and of the peak
memory: median, 90th percentile and worst, per model family and overall
(``nnperf.measure.validation.error_table``).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from nnperf.measure.validation import Config, error_table, load_records


def repredict(record: dict[str, Any], gpu_name: str | None) -> None:
    """Predict the record's configuration again with the current code: the step time on
    ``gpu_name`` (when given) and the peak memory of what the record measured."""
    from nnperf.analysis import analyze_request
    from nnperf.hardware import load_gpu
    from nnperf.measure.runner import predicted_peak_memory
    from nnperf.passes.timing import TimingOptions
    from nnperf.prediction import predict_analysis

    cfg = Config(record["model"], record["train"], record["precision"], record["batch"], record.get("seq"))
    analysis = analyze_request(cfg.request(), cfg.trace_options())
    device = record.get("device", "cuda")
    record["predicted_peak_memory_bytes"] = predicted_peak_memory(analysis, device)
    if gpu_name:
        p = predict_analysis(analysis, load_gpu(gpu_name), timing=TimingOptions(tf32_matmul=cfg.tf32))
        record["predicted_step_time_s"] = p.step.step_s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder")
    parser.add_argument("--gpu", help="catalog GPU to predict (default: each record's gpu)")
    parser.add_argument("--recorded", action="store_true", help="use the predictions stored in the records")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    records = [r for r in load_records(args.folder) if r.get("fits", True) and "measured_step_time_s" in r]
    if not args.recorded:
        for r in records:
            r["predicted_step_time_s"] = None
            repredict(r, args.gpu or r.get("gpu"))
    tables = {"nnperf: step time": error_table(records)}
    if any(r.get("runtime_estimator_step_time_s") for r in records):
        tables["torch RuntimeEstimator: step time"] = error_table(records, key="runtime_estimator_step_time_s")
    tables["nnperf: peak memory"] = error_table(
        records, key="predicted_peak_memory_bytes", measured_key="measured_peak_memory_bytes")
    if args.json:
        print(json.dumps(tables, indent=2))
        return 0
    for name, table in tables.items():
        print(f"\n{name}: absolute percentage error ({len(records)} records)")
        print(f"{'family':<20}{'n':>4}{'median':>10}{'p90':>10}{'worst':>10}  worst config")
        for family, row in table.items():
            def pct(v: float | None) -> str:
                return "-" if v is None else f"{v:.1f}%"
            print(f"{family:<20}{row['n']:>4}{pct(row['median_ape']):>10}{pct(row['p90_ape']):>10}"
                  f"{pct(row['worst_ape']):>10}  {row['worst_config'] or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
