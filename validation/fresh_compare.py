"""The fresh configurations' errors: against the frozen predictions and against today's model.

    python validation/fresh_compare.py validation/fresh/frozen-2026-12-02.json validation/data/h200-sxm
    python validation/fresh_compare.py FROZEN RECORDS --markdown     # the README's table
    python validation/fresh_compare.py FROZEN RECORDS --json

The frozen file (``validation/fresh.py freeze``) holds each configuration's predicted step time
from the model as it was before any change the measurements could inform: datasheet entry and
the calibration committed beside the first run. Each measured record of those configurations
(``validation/run.py --fresh``; a dry run's ``-tiny`` stand-ins are matched to theirs) is set
beside those numbers as they are, and beside the same configuration predicted again by today's
code (``measure.validation.repredict``), so the table shows how the model did on runs it had
never seen, then and now. Errors are signed, (predicted - measured) / measured; the summary
rows are the median and 90th percentile of their absolute values. A configuration with no
measurement says why (the record's error, or that no record has it).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fresh import SCHEMA, tiny

from nnperf.measure.stats import percentile
from nnperf.measure.validation import Config, calibrated_profile, load_records, repredict

#: The four predictions each measured configuration is compared with, in table order.
COLUMNS = (("frozen_datasheet", "frozen, datasheet"), ("frozen_calibrated", "frozen, calibrated"),
           ("today_datasheet", "today, datasheet"), ("today_calibrated", "today, calibrated"))


@dataclass
class Row:
    """One frozen configuration: what was measured and the four predictions of it."""

    config: str
    measured_s: float | None = None
    fastest_s: float | None = None
    frozen_datasheet: float | None = None
    frozen_calibrated: float | None = None
    today_datasheet: float | None = None
    today_calibrated: float | None = None
    note: str = ""

    def error(self, column: str) -> float | None:
        predicted = getattr(self, column)
        if predicted is None or not self.measured_s:
            return None
        return (predicted - self.measured_s) / self.measured_s


def rows(frozen: dict[str, Any], records: list[dict[str, Any]], gpu: str | None, profile: Any) -> list[Row]:
    """Each frozen configuration with its record (full-size or its tiny stand-in), if any."""
    by_name: dict[str, dict[str, Any]] = {}
    for r in records:  # the last record of a name wins: a rerun replaces a failed run
        by_name[r["config"]] = r
    out = []
    for entry in frozen["configs"]:
        config = Config.from_record(entry)
        record = by_name.get(config.name) or by_name.get(tiny(config).name)
        row = Row(config.name, frozen_datasheet=entry.get("predicted_step_time_s"),
                  frozen_calibrated=entry.get("predicted_step_time_calibrated_s"))
        out.append(row)
        if record is None:
            row.note = "not measured: no record"
            continue
        measured = record.get("measured_step_time_s")
        if not isinstance(measured, dict) or not measured.get("median"):
            reason = record.get("error") or record.get("skipped") or "no step time"
            row.note = f"not measured: {str(reason).splitlines()[0][:120]}"
            continue
        row.measured_s, row.fastest_s = measured["median"], measured.get("min")
        if record["config"] != config.name:
            row.note = f"measured as {record['config']} (a dry run's stand-in)"
        today = dict(record)
        repredict(today, gpu, profile)
        row.today_datasheet = today.get("predicted_step_time_s")
        row.today_calibrated = today.get("predicted_step_time_calibrated_s")
    return out


def summary(table: list[Row]) -> dict[str, dict[str, float | int | None]]:
    """Median and p90 of |error| per column, over the configurations measured."""
    out: dict[str, dict[str, float | int | None]] = {}
    for column, _ in COLUMNS:
        errors = [abs(e) * 100 for e in (r.error(column) for r in table) if e is not None]
        out[column] = {"n": len(errors), "median_ape": percentile(errors, 50) if errors else None,
                       "p90_ape": percentile(errors, 90) if errors else None}
    return out


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.2f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:+.1f}%"


def render(table: list[Row], markdown: bool) -> str:
    head = ["configuration", "measured ms", *(f"{label} ms (err)" for _, label in COLUMNS)]
    lines = []
    body = [[r.config, _ms(r.measured_s),
             *(f"{_ms(getattr(r, c))} ({_pct(r.error(c))})" for c, _ in COLUMNS)] for r in table]
    stats = summary(table)
    foot = [["median / p90 |error|", f"n={max((s['n'] or 0) for s in stats.values())}",
             *(f"{_num(stats[c]['median_ape'])} / {_num(stats[c]['p90_ape'])}" for c, _ in COLUMNS)]]
    if markdown:
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        lines += ["| " + " | ".join(cells) + " |" for cells in body + foot]
    else:
        widths = [max(len(str(row[i])) for row in [head, *body, *foot]) for i in range(len(head))]
        for cells in [head, *body, *foot]:
            lines.append("  ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)))
    notes = [f"{r.config}: {r.note}" for r in table if r.note]
    if notes:
        lines.append("")
        lines += notes
    return "\n".join(lines)


def _num(value: float | int | None) -> str:
    return "-" if value is None else f"{value:.1f}%"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("frozen", type=Path, help="the frozen configurations (validation/fresh/frozen-*.json)")
    parser.add_argument("records", type=Path, help="a records .jsonl file or a folder of them")
    parser.add_argument("--gpu", help="catalog GPU today's model predicts (default: the frozen file's)")
    parser.add_argument("--profile", type=Path,
                        help="calibrated profile for today's second column (default: profile.toml beside "
                             "the records, else the frozen file's)")
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--markdown", action="store_true", help="a Markdown table (the README's)")
    out.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        frozen = json.loads(args.frozen.read_text())
    except OSError as err:
        print(f"error: {args.frozen}: {err.strerror or err}", file=sys.stderr)
        return 2
    except ValueError as err:
        print(f"error: {args.frozen}: not a frozen configuration file (not JSON: {err})", file=sys.stderr)
        return 2
    if not isinstance(frozen, dict) or frozen.get("schema") != SCHEMA:
        print(f"error: {args.frozen}: not a frozen configuration file (schema {SCHEMA})", file=sys.stderr)
        return 2
    if not args.records.exists():
        print(f"error: {args.records} does not exist: give a records .jsonl file or a folder", file=sys.stderr)
        return 2
    gpu = args.gpu or frozen.get("gpu")
    given = args.profile or (Path(__file__).parent.parent / frozen["profile"] if frozen.get("profile") else None)
    beside = (args.records if args.records.is_dir() else args.records.parent) / "profile.toml"
    profile = calibrated_profile(args.records, gpu, args.profile or (None if beside.exists() else given))
    table = rows(frozen, load_records(args.records), gpu, profile)
    if args.json:
        print(json.dumps({"frozen": str(args.frozen), "model_commit": frozen.get("model_commit"), "gpu": gpu,
                          "rows": [dict(asdict(r), **{f"{c}_error": r.error(c) for c, _ in COLUMNS}) for r in table],
                          "summary": summary(table)}, indent=1))
    else:
        print(f"fresh configurations of {args.frozen.name} (frozen at {frozen.get('model_commit', '?')[:12]}) "
              f"on {gpu}: step time, signed error vs the measured median")
        print(render(table, args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
