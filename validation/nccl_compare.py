"""nnperf's collective times against published nccl-tests tables (``multi_gpu/nccl_tests.toml``).

    python validation/nccl_compare.py [--rows] [--json]

Each table row (one message size) is predicted by ``kernels.collectives.estimate_collective``
on the table's cluster file and group (nodes x GPUs per node, ranks in node order) and
compared on time (or on bus bandwidth where the source gives only that). Printed per table:
the median |error| over all sizes and per regime: latency (up to 64 KiB, where NCCL's latency
model decides), middle, and bandwidth (256 MiB and up, where the cluster file's bus bandwidth
decides); with ``--rows`` each size with NCCL's choice (algorithm/protocol). No target is
given by the issue for these; nothing here is tuned to the tables (the two whose largest rows
supplied a constant say so in their grade_reason).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import tomllib

from nnperf.hardware.cluster import load_cluster
from nnperf.kernels.collectives import bus_factor, estimate_collective

TABLES = Path(__file__).parent / "multi_gpu" / "nccl_tests.toml"
REGIMES = (("latency", 0, 64 * 2**10), ("middle", 64 * 2**10 + 1, 256 * 2**20 - 1), ("bandwidth", 256 * 2**20, 2**62))


def compare_table(table: dict) -> dict:
    """Each size of ``table`` measured against predicted, and the medians per regime."""
    cluster = load_cluster(table["cluster"])
    ranks = tuple(range(table["nodes"] * table["gpus_per_node"]))
    kind = table["collective"]
    factor = bus_factor(kind, len(ranks))
    rows = []
    for size, value in table["rows"]:
        est = estimate_collective(kind, int(size), ranks, cluster)
        if table.get("metric") == "busbw_gbs":
            measured_s = size * factor / (value * 1e9)
        else:
            measured_s = value * 1e-6
        rows.append({"bytes": int(size), "measured_s": measured_s, "predicted_s": est.time_s,
                     "error": est.time_s / measured_s - 1, "measured_busbw_gbs": size * factor / measured_s / 1e9,
                     "predicted_busbw_gbs": size * factor / est.time_s / 1e9,
                     "choice": f"{est.algorithm}/{est.protocol}" if est.algorithm else "tier"})
    medians = {"all": statistics.median(abs(r["error"]) for r in rows)}
    for name, lo, hi in REGIMES:
        errs = [abs(r["error"]) for r in rows if lo <= r["bytes"] <= hi]
        if errs:
            medians[name] = statistics.median(errs)
    return {"id": table["id"], "grade": table["grade"], "ranks": len(ranks), "nodes": table["nodes"],
            "cluster": table["cluster"], "rows": rows, "median_abs_error": medians}


def load_tables(path: Path = TABLES) -> list[dict]:
    with open(path, "rb") as f:
        return tomllib.load(f)["table"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", action="store_true", help="print every size")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    results = [compare_table(t) for t in load_tables()]
    if args.json:
        json.dump(results, sys.stdout, indent=1)
        print()
        return 0
    for r in results:
        m = r["median_abs_error"]
        regimes = "  ".join(f"{k} {100 * v:.0f}%" for k, v in m.items() if k != "all")
        print(f"{r['id']:<30} {r['grade']:<11} {r['ranks']:>4} ranks on {r['nodes']:>2} nodes ({r['cluster']}): "
              f"median |error| {100 * m['all']:.0f}%  ({regimes})")
        if args.rows:
            for row in r["rows"]:
                print(f"    {row['bytes']:>12} B  measured {row['measured_s'] * 1e6:10.1f} us "
                      f"({row['measured_busbw_gbs']:6.1f} GB/s)  predicted {row['predicted_s'] * 1e6:10.1f} us "
                      f"({row['predicted_busbw_gbs']:6.1f} GB/s)  {100 * row['error']:+6.1f}%  {row['choice']}")
    for grade in ("faithful", "approximate"):
        errs = [abs(row["error"]) for r in results if r["grade"] == grade for row in r["rows"]]
        if errs:
            print(f"{grade} tables: median |error| {100 * statistics.median(errs):.1f}% over {len(errs)} sizes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
