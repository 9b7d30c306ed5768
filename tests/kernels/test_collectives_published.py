"""The collectives model against published nccl-tests tables (validation/nccl_compare.py).

Regression guards at the figures of 2026-11-28 with a margin, not targets met by tuning: on
DGX-class H100 clusters of 4 and 8 nodes running NCCL's defaults, the model's all-reduce time
is within 3-4% (median) where bandwidth decides, and within 11% over all sizes; NCCL's own
latency model (no constant of nnperf's) puts small all-reduces on 2 and 4 nodes within ~15%.
"""

from __future__ import annotations

import importlib.util
import statistics
from pathlib import Path

import pytest

pytestmark = pytest.mark.accuracy

_SPEC = importlib.util.spec_from_file_location(
    "nccl_compare", Path(__file__).resolve().parents[2] / "validation" / "nccl_compare.py")
_COMPARE = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_COMPARE)
compare_table, load_tables = _COMPARE.compare_table, _COMPARE.load_tables

RESULTS = {t["id"]: compare_table(t) for t in load_tables()}


def test_every_table_is_sourced_and_graded():
    for table in load_tables():
        assert table["source"] and table["setup"] and table["grade"] in ("faithful", "approximate")
        assert table["grade_reason"] and len(table["rows"]) >= 10


def test_bandwidth_bound_all_reduce_on_2_to_8_h100_nodes():
    """Two nodes run NVLS tree, at up to twice the network's ring bandwidth (3-4% off); 4 and 8
    nodes at the network's (1-2%)."""
    for name in ("nccl-tests-309-2x8-h100", "nccl-tests-309-2x8-h100-b", "nccl-tests-309-4x8-h100-b",
                 "nccl-tests-309-8x8-h100-b"):
        assert RESULTS[name]["median_abs_error"]["bandwidth"] <= 0.06, name


def test_faithful_tables_over_all_sizes():
    """15.4% over 74 sizes: the middle sizes (1-256 MiB) across nodes run 20-40% slower than
    NCCL's own model of the algorithm it picks (NVLS tree from 32 MiB: its latency model is
    the optimistic one), which nnperf follows rather than fits."""
    errors = [abs(r["error"]) for res in RESULTS.values() if res["grade"] == "faithful" for r in res["rows"]]
    assert statistics.median(errors) <= 0.17


def test_small_all_reduce_latency_across_nodes_is_nccls_model():
    """16 B to 128 B on 2 and 4 nodes (the first size of each run, a warm-up outlier, aside):
    NCCL's tree/LL latency, 6.8 + 2 x (7 x 0.6 + log2(nodes) x 5.0) us."""
    for name, nodes in (("nccl-tests-309-2x8-h100", 2), ("nccl-tests-309-4x8-h100-vm", 4)):
        rows = [r for r in RESULTS[name]["rows"] if 16 <= r["bytes"] <= 128]
        assert rows and all(r["choice"] == "tree/LL" for r in rows)
        expected = (6.8 + 2 * (7 * 0.6 + (nodes.bit_length() - 1) * 5.0)) * 1e-6
        for r in rows:
            assert r["measured_s"] == pytest.approx(expected, rel=0.05)
