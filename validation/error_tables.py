"""What the validation scripts share: printing error tables and checking them against a
committed baseline (``compare.py`` for GPU records, ``published_compare.py`` for published ones)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from nnperf.measure.validation import regressions

Tables = dict[str, dict[str, dict[str, Any]]]


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}%"


def print_tables(tables: Tables, group: str, count: str) -> None:
    """Each table: median, p90 and worst absolute percentage error per ``group``."""
    for name, table in tables.items():
        print(f"\n{name}: absolute percentage error ({count})")
        print(f"{group:<20}{'n':>4}{'median':>10}{'p90':>10}{'worst':>10}  worst")
        for key, row in table.items():
            print(f"{key:<20}{row['n']:>4}{_pct(row['median_ape']):>10}{_pct(row['p90_ape']):>10}"
                  f"{_pct(row['worst_ape']):>10}  {row['worst_config'] or '-'}")


def check_baseline(tables: Tables, baseline: Path | None, write: Path | None) -> int:
    """Write ``tables`` as the new baseline if asked; exit status 1 where they are worse than
    ``baseline`` (each regression named on stderr), else 0."""
    if write:
        write.write_text(json.dumps(tables, indent=1) + "\n")
    if not baseline:
        return 0
    worse = regressions(tables, json.loads(baseline.read_text()))
    for line in worse:
        print(f"regression: {line}", file=sys.stderr)
    return 1 if worse else 0
