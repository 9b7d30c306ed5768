"""Percentiles, spreads and the validation error table, against hand-computed values."""

from __future__ import annotations

import pytest

from nnperf.measure.stats import Spread, percentile, relative_error
from nnperf.measure.validation import default_configs, error_table, select


def test_percentile_interpolates_between_ranks():
    data = [4.0, 1.0, 3.0, 2.0, 5.0]  # sorted: 1 2 3 4 5, positions 0..4
    assert percentile(data, 50) == 3.0
    assert percentile(data, 10) == pytest.approx(1.4)  # pos 0.4: 1 + 0.4 * (2 - 1)
    assert percentile(data, 90) == pytest.approx(4.6)  # pos 3.6: 4 + 0.6 * (5 - 4)
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    with pytest.raises(ValueError):
        percentile([], 50)


def test_spread_fields():
    s = Spread.of([10.0, 20.0, 30.0, 40.0, 50.0])
    assert (s.median, s.q1, s.q3, s.iqr, s.minimum, s.maximum, s.n) == (30.0, 20.0, 40.0, 20.0, 10.0, 50.0, 5)
    assert s.relative_spread == pytest.approx((46.0 - 14.0) / 30.0)


def test_relative_error():
    assert relative_error(1.5, 1.0) == pytest.approx(0.5)
    assert relative_error(None, 1.0) is None and relative_error(1.0, 0.0) is None


def test_error_table_by_family_and_overall():
    # cnn errors: |1.1-1|=10%, |0.8-1|=20%, |1.3-1|=30%; decoder: |2.5-2|/2=25%; one skipped
    records = [
        {"config": "a", "family": "cnn", "measured_step_time_s": {"median": 1.0}, "predicted_step_time_s": 1.1},
        {"config": "b", "family": "cnn", "measured_step_time_s": 1.0, "predicted_step_time_s": 0.8},
        {"config": "c", "family": "cnn", "measured_step_time_s": 1.0, "predicted_step_time_s": 1.3},
        {"config": "d", "family": "decoder", "measured_step_time_s": 2.0, "predicted_step_time_s": 2.5},
        {"config": "e", "family": "decoder", "measured_step_time_s": 2.0, "predicted_step_time_s": None},
    ]
    table = error_table(records)
    cnn, dec, overall = table["cnn"], table["decoder"], table["overall"]
    assert cnn["n"] == 3 and cnn["median_ape"] == pytest.approx(20.0)
    assert cnn["p90_ape"] == pytest.approx(28.0)  # sorted 10 20 30, pos 1.8: 20 + 0.8 * 10
    assert cnn["worst_ape"] == pytest.approx(30.0) and cnn["worst_config"] == "c"
    assert dec["n"] == 1 and dec["skipped"] == 1 and dec["median_ape"] == pytest.approx(25.0)
    # overall: 10 20 25 30 -> median 22.5; p90 pos 2.7: 25 + 0.7 * 5 = 28.5
    assert overall["n"] == 4 and overall["median_ape"] == pytest.approx(22.5)
    assert overall["p90_ape"] == pytest.approx(28.5) and overall["skipped"] == 1
    assert list(table)[-1] == "overall"


def test_error_table_of_peak_memory():
    # |110-100|/100 = 10%, |95-100|/100 = 5%; the step-time fields are ignored
    records = [
        {"config": "a", "family": "cnn", "measured_peak_memory_bytes": 100, "predicted_peak_memory_bytes": 110,
         "measured_step_time_s": 1.0, "predicted_step_time_s": 9.0},
        {"config": "b", "family": "cnn", "measured_peak_memory_bytes": 100, "predicted_peak_memory_bytes": 95},
    ]
    row = error_table(records, key="predicted_peak_memory_bytes", measured_key="measured_peak_memory_bytes")["cnn"]
    assert row["n"] == 2 and row["median_ape"] == pytest.approx(7.5)
    assert row["worst_ape"] == pytest.approx(10.0) and row["worst_config"] == "a"


def test_configs_cover_every_zoo_model_mode_precision_and_two_batches():
    from nnperf.zoo import list_models

    configs = default_configs()
    for spec in list_models(presets=False):  # a preset is its family's classes, larger than one GPU
        mine = [c for c in configs if c.model == spec.name]
        assert {c.train for c in mine} == {True, False}
        assert {c.precision for c in mine} == {"fp32", "tf32", "bf16"}
        assert len({c.batch for c in mine}) >= 2
    assert [c.name for c in select(configs, ["mlp-infer-bf16"])] == ["mlp-infer-bf16-b64", "mlp-infer-bf16-b1024"]
