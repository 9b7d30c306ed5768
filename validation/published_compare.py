"""nnperf's predictions against measurements others published (``validation/published/``).

    python validation/published_compare.py [--rows] [--json]
    python validation/published_compare.py --write-baseline validation/published/baseline.json

Every reproducible single-GPU row is predicted with the current code on its catalog GPU and
compared by step time, or by device memory for ``memory`` rows (``nnperf.measure.published``);
rows nnperf cannot build are counted with the reason. The tables: median, p90 and worst
absolute percentage error per task (training, inference, gemm; memory in a table of its own)
for faithful and approximate rows. ``--baseline FILE`` exits 1
where a table got worse (what CI checks, ``tests/measure/test_published.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from error_tables import check_baseline, print_tables

from nnperf.measure.published import load_rows, records, tables

FOLDER = Path(__file__).parent / "published"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", action="store_true", help="print every row's measured and predicted time")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--baseline", type=Path, help="fail (exit 1) where a table is worse than this one")
    parser.add_argument("--write-baseline", type=Path, help="write the tables here as the new baseline")
    args = parser.parse_args(argv)
    recs = records(load_rows(FOLDER))
    result = tables(recs)
    if args.json:
        print(json.dumps({"tables": result, "records": recs}, indent=1))
    else:
        if args.rows:
            for r in recs:
                if "predicted_step_time_s" in r:
                    m, p = r["measured_step_time_s"], r["predicted_step_time_s"]
                    print(f"{r['grade']:<12}{r['config']:<66}{m * 1e3:10.2f} ms{p * 1e3:10.2f} ms{100 * (p / m - 1):+8.1f}%")
                elif "predicted_memory_mib" in r:
                    m, p = r["measured_memory_mib"], r["predicted_memory_mib"]
                    print(f"{r['grade']:<12}{r['config']:<66}{m:7.0f} MiB{p:7.0f} MiB{100 * (p / m - 1):+8.1f}%")
        skipped = Counter(r["not_reproducible"].split(" (")[0] for r in recs if "not_reproducible" in r)
        print(f"{len(recs)} published rows: {sum(skipped.values())} not reproducible by nnperf:")
        for reason, n in skipped.most_common():
            print(f"  {n:4}  {reason}")
        print_tables(result, "task", "single-GPU rows nnperf can build")
    return check_baseline(result, args.baseline, args.write_baseline)

if __name__ == "__main__":
    sys.exit(main())
