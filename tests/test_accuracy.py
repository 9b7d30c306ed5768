"""The track record: which measured runs are like a workload, and the medians cited from them,
on a small synthetic table whose answers are worked out by hand beside each test."""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise

import pytest

from nnperf.accuracy import (
    LADDER,
    MIN_RUNS,
    TABLE_FILE,
    MeasuredRun,
    RunTraits,
    gpu_traits,
    load_table,
    table_text,
    track_record,
)
from nnperf.hardware import load_gpu

H200 = RunTraits("h200-sxm", "H200 SXM 141GB", "NVIDIA", "Hopper", "data-centre", "cnn", "bf16", "train", "compute")


def run(i: int, error: float, **traits) -> MeasuredRun:
    return MeasuredRun(f"r{i}", "test", None, replace(H200, **traits), error)


#: r0-r2: H200 bf16 CNN training, compute-bound; r3-r4 memory-bound; r5-r6 fp16; r7-r9 H100
#: (Hopper) bf16 CNN training; r10-r12 A100 (data-centre Ampere) decoders; r13 inference.
TABLE = (
    run(0, -0.40), run(1, -0.50), run(2, -0.30),
    run(3, -0.10, bound="memory"), run(4, -0.20, bound="memory"),
    run(5, 0.10, precision="fp16", bound="host"), run(6, 0.20, precision="fp16"),
    run(7, -0.05, gpu="h100-sxm", gpu_name="H100 SXM5 80GB"),
    run(8, 0.05, gpu="h100-sxm", gpu_name="H100 SXM5 80GB", bound="memory"),
    run(9, 0.15, gpu="h100-sxm", gpu_name="H100 SXM5 80GB", family="decoder"),
    run(10, -0.60, gpu="a100-80gb-sxm", architecture="Ampere", family="decoder"),
    run(11, -0.70, gpu="a100-80gb-sxm", architecture="Ampere", family="decoder"),
    run(12, -0.80, gpu="a100-80gb-sxm", architecture="Ampere", family="decoder"),
    run(13, 0.90, mode="inference"),
)


def test_exact_matches_when_there_are_enough():
    record = track_record(H200, TABLE)
    # r0-r2: errors -0.40, -0.50, -0.30 -> |.| median 0.40, signed median -0.40
    assert (record.n, record.median_abs_error, record.median_signed_error) == (3, pytest.approx(0.40), pytest.approx(-0.40))
    assert record.relaxed == ()
    assert dict(record.matched) == {"gpu": "h200-sxm", "family": "cnn", "precision": "bf16", "mode": "train",
                                    "bound": "compute"}
    assert record.description == "H200 SXM 141GB, bf16 CNN training, compute-bound"
    assert dict(record.sources) == {"test": 3}


def test_too_few_exact_matches_relax_the_bound_first():
    # host-bound H200 bf16 CNN training: no exact run; any bound: r0-r4 -> -0.40 -0.50 -0.30 -0.10 -0.20
    record = track_record(replace(H200, bound="host"), TABLE)
    assert record.relaxed == ("bound",)
    assert record.n == 5
    assert record.median_signed_error == pytest.approx(-0.30)
    assert record.median_abs_error == pytest.approx(0.30)
    assert "any bound" in record.description


def test_then_the_precision_to_its_width():
    # fp16: r5, r6 only (2 < 3) -> 16-bit: r0-r6 = -0.40 -0.50 -0.30 -0.10 -0.20 +0.10 +0.20
    record = track_record(replace(H200, precision="fp16"), TABLE)
    assert record.relaxed == ("bound", "precision")
    assert record.n == 7
    assert record.median_signed_error == pytest.approx(-0.20)
    assert record.median_abs_error == pytest.approx(0.20)  # |.| sorted: .1 .1 .2 .2 .3 .4 .5
    assert dict(record.matched)["width"] == "16-bit"


def test_then_the_gpu_to_its_architecture():
    # H100 bf16 CNN training: r7, r8 (2) on the H100 at any bound and width -> Hopper: r0-r8
    record = track_record(replace(H200, gpu="h100-sxm", gpu_name="H100 SXM5 80GB"), TABLE)
    assert record.relaxed == ("bound", "precision", "gpu")
    assert record.n == 9  # r9 is a decoder
    # signed: -.5 -.4 -.3 -.2 -.1 -.05 .05 .1 .2 -> median -0.10; |.|: .05 .05 .1 .1 .2 .2 .3 .4 .5 -> 0.2
    assert record.median_signed_error == pytest.approx(-0.10)
    assert record.median_abs_error == pytest.approx(0.20)
    assert record.description.startswith("NVIDIA Hopper GPUs, 16-bit CNN training")


def test_then_the_architecture_to_the_segment():
    # an L40S (data-centre Ada) decoder: no L40S and no Ada run; by segment the data-centre
    # NVIDIA 16-bit decoder training runs r9 (H100) and r10-r12 (A100)
    l40s = replace(H200, gpu="l40s", gpu_name="L40S", architecture="Ada Lovelace", family="decoder")
    record = track_record(l40s, TABLE)
    assert record.relaxed == ("bound", "precision", "gpu", "architecture")
    # -.8 -.7 -.6 +.15 -> signed median -0.65; |.| .15 .6 .7 .8 -> 0.65
    assert record.n == 4
    assert record.median_signed_error == pytest.approx(-0.65)
    assert record.median_abs_error == pytest.approx(0.65)


def test_then_the_family():
    # an encoder on the H200: no encoder anywhere -> data-centre NVIDIA 16-bit training, any
    # family: r0-r12 (13 runs; r13 is inference)
    record = track_record(replace(H200, family="encoder"), TABLE)
    assert record.relaxed == ("bound", "precision", "gpu", "architecture", "family")
    assert record.n == 13
    errors = sorted(r.error for r in TABLE[:13])
    assert record.median_signed_error == pytest.approx(errors[6])
    assert "any model family" in record.description


def test_one_or_two_runs_at_the_loosest_level_are_cited_with_their_count():
    # inference: r13 alone (+0.90) at every level
    record = track_record(replace(H200, mode="inference"), TABLE)
    assert (record.n, record.median_abs_error, record.median_signed_error) == (1, 0.90, 0.90)
    assert "predicted slower than measured (median +90%)" in record.text()


def test_nothing_alike_says_so():
    amd = replace(H200, gpu="mi300x", gpu_name="MI300X", vendor="AMD", architecture="CDNA3")
    record = track_record(amd, TABLE)
    assert (record.n, record.median_abs_error, record.median_signed_error) == (0, None, None)
    assert not record.found
    assert record.text() == ("runs like this one: none measured (no 16-bit training run on data-centre AMD "
                             "GPUs): nnperf has not been checked on anything like this workload")
    doc = record.to_json()
    assert doc["n"] == 0 and doc["median_abs_error"] is None and doc["median_signed_error"] is None
    # what was still compared when nothing was left: never relaxed
    assert doc["matched"] == {"vendor": "AMD", "segment": "data-centre", "width": "16-bit", "mode": "train"}
    assert record.cell() == "none measured"


def test_training_never_borrows_inference_and_width_is_never_relaxed():
    fp32 = replace(H200, precision="fp32")  # 32-bit: nothing in TABLE, though bf16 runs abound
    assert track_record(fp32, TABLE).n == 0


def test_the_text_cites_the_median_the_bias_and_what_the_runs_share():
    record = track_record(H200, TABLE)
    assert record.text() == ("runs like this one: median error 40% (n=3: H200 SXM 141GB, bf16 CNN training, "
                             "compute-bound), predicted faster than measured (median -40%)")
    assert record.cell() == "40% (n=3)"


def test_each_level_finds_a_superset_of_the_one_before():
    for traits in (H200, replace(H200, precision="fp16", bound="memory"), replace(H200, family="decoder")):
        found = [{r.id for r in TABLE if all(read(r.traits) == read(traits) for _, read in level.compared)}
                 for level in LADDER]
        assert all(a <= b for a, b in pairwise(found))


def test_a_users_gpu_file_or_what_if_is_not_the_catalog_card():
    h200 = load_gpu("h200")
    assert gpu_traits(h200)["gpu"] == "h200-sxm" and gpu_traits(h200)["segment"] == "data-centre"
    what_if = load_gpu("h200", overrides={"memory_bandwidth_gbs": "9000"})
    assert gpu_traits(what_if)["gpu"] is None  # its numbers are not the measured card's
    assert gpu_traits(what_if)["architecture"] == "Hopper"


def test_the_table_file_round_trips(tmp_path):
    path = tmp_path / "accuracy.json"
    path.write_text(table_text(TABLE))
    assert load_table(path) == TABLE


def test_the_committed_table_is_readable_and_large_enough_to_cite():
    runs = load_table(TABLE_FILE)
    assert len(runs) >= 50 and len({r.id for r in runs}) == len(runs)
    assert {r.traits.mode for r in runs} == {"train", "inference"}
    assert MIN_RUNS == 3
