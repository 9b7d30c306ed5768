"""The table behind every prediction's track record: write it, or check the committed one.

    python validation/accuracy_table.py            # check: exit 1 where the model moved
    python validation/accuracy_table.py --write    # rewrite src/nnperf/data/accuracy.json

Every committed measurement (nnperf's GPU runs in ``data/*/``, the published single-GPU
training and inference rows in ``published/``) is re-predicted with the current code and
stored with its traits and signed error (``nnperf.measure.accuracy_table``); ``nnperf
predict`` and the other commands cite the runs most like a workload from it
(``nnperf.accuracy``). Run ``--write`` in the commit of any change that moves predictions:
the test ``tests/measure/test_accuracy_table.py`` (marker ``accuracy``) fails until then.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path
from statistics import median

from nnperf.accuracy import TABLE_FILE, load_table, table_text
from nnperf.measure.accuracy_table import build_table, stale_rows

FOLDER = Path(__file__).parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help=f"rewrite {TABLE_FILE.name} in the package")
    args = parser.parse_args(argv)
    runs = build_table(FOLDER)
    print(f"{len(runs)} measured runs")
    for source, n in sorted(Counter(r.source for r in runs).items()):
        errors = [r.error for r in runs if r.source == source]
        print(f"  {source:<36} n={n:<4} median |error| {median(abs(e) for e in errors):6.1%}, "
              f"median error {median(errors):+6.1%}")
    if args.write:
        TABLE_FILE.parent.mkdir(parents=True, exist_ok=True)
        TABLE_FILE.write_text(table_text(runs), encoding="utf-8")
        print(f"wrote {TABLE_FILE}")
        return 0
    stale = stale_rows(load_table(), runs)
    for line in stale:
        print(f"stale: {line}")
    if stale:
        print(f"{len(stale)} differences: the model moved; run python validation/accuracy_table.py --write")
        return 1
    print("the committed table matches the current model")
    return 0


if __name__ == "__main__":
    sys.exit(main())
