"""Compare committed measurements with nnperf's current predictions: the error tables.

    python validation/compare.py validation/data/h100 [--gpu h100-sxm] [--recorded] [--json]
    python validation/compare.py validation/data/h100 --write-baseline validation/data/h100/baseline.json

By default each record's configuration is predicted again with the current code (so the
table tracks the model as it changes); ``--recorded`` uses the predictions stored in the
records instead. Errors are absolute percentage errors of the step time and of the peak
memory: median, 90th percentile and worst, per model family and overall
(``nnperf.measure.validation.error_table``). ``--baseline FILE`` exits 1 if a table got worse
than the committed one (what CI checks); ``--write-baseline FILE`` records the current tables.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from error_tables import check_baseline, print_tables

from nnperf.measure.validation import calibrated_profile, error_tables, load_records, repredict


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", help="a records .jsonl file or a folder of them")
    parser.add_argument("--gpu", help="catalog GPU to predict (default: each record's gpu)")
    parser.add_argument("--recorded", action="store_true", help="use the predictions stored in the records")
    parser.add_argument("--profile", type=Path,
                        help="a calibrated profile of the GPU: a second step-time table from it "
                             "(default: profile.toml beside the records, if any)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--baseline", type=Path, help="fail (exit 1) where a table is worse than this one")
    parser.add_argument("--write-baseline", type=Path, help="write the tables here as the new baseline")
    args = parser.parse_args(argv)
    records = [r for r in load_records(args.path) if r.get("fits", True) and "measured_step_time_s" in r]
    if not args.recorded:
        profile = calibrated_profile(args.path, args.gpu or (records[0].get("gpu") if records else None), args.profile)
        for r in records:
            repredict(r, args.gpu or r.get("gpu"), profile)
    tables = error_tables(records)
    if args.json:
        print(json.dumps(tables, indent=2))
    else:
        print_tables(tables, "family", f"{len(records)} records")
    return check_baseline(tables, args.baseline, args.write_baseline)

if __name__ == "__main__":
    sys.exit(main())
