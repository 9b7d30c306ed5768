"""validation/sustained_clock.py's dry run on the CPU: every load's code path (a real process,
the script as a GPU session calls it), its file whole and its summaries read off its samples."""

from __future__ import annotations

import json
import statistics

import pytest


@pytest.mark.slow
def test_the_cpu_dry_run_holds_every_load_and_summarizes_its_samples(tmp_path, run_validation_script):
    out = tmp_path / "sustained-clock.json"
    done = run_validation_script("sustained_clock.py", "--device", "cpu", "--out", str(out), "--seconds", "0.3",
                                 timeout=600)
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    assert doc["schema"] == "nnperf.sustained_clock/1" and doc["complete"]
    assert [r["load"] for r in doc["rows"]] == ["gemm-bf16", "gemm-fp8", "step-bf16"]
    for row in doc["rows"]:
        assert "skipped" not in row and row["samples"]
        # the last half's median is the median of the samples taken from 0.15 s on
        late = [s["rate"] for s in row["samples"] if s["at_s"] >= 0.15] or [row["samples"][-1]["rate"]]
        assert row["last_half"]["rate"] == pytest.approx(statistics.median(late))
        assert row["last_half"]["sm_clock_mhz"] is None  # a CPU has no SM clock: said, not zero
    gemm = doc["rows"][0]
    sample = gemm["samples"][0]  # a rate is the calls' FLOPs over their time: 8 x 2 x 64^3
    assert sample["rate"] == pytest.approx(8 * 2 * 64**3 / (8 * sample["seconds_per_call"]))
    assert doc["rows"][2]["unit"] == "tokens"
    assert not list(tmp_path.glob(".*.tmp"))  # every write renamed into place
