"""The convolution efficiency table: its classes, its profile handling, and its values as the
committed DeepBench derivation (validation/deepbench_conv.py) gives them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from nnperf.errors import UsageError
from nnperf.hardware import default_profile, load_gpu, load_profile, save_profile
from nnperf.hardware.profile import CONV_CLASSES, conv_efficiency_class

ROOT = Path(__file__).resolve().parents[2]


def test_classes_by_hand():
    assert conv_efficiency_class(1, 14 * 14, "forward") == "stride1_large"  # the 14x14 boundary
    assert conv_efficiency_class(1, 56 * 56, "grad_weight") == "stride1_large"  # every pass
    assert conv_efficiency_class(1, 13 * 15, "grad_input") == "other_grad_input"  # 195 positions
    assert conv_efficiency_class(1, 7 * 7, "forward") == "other_forward"
    assert conv_efficiency_class(2, 112 * 112, "grad_weight") == "other_grad_weight"
    assert conv_efficiency_class(2, 112 * 112, "backward") == "other_forward"  # not a gradient role
    assert conv_efficiency_class(2, 7 * 7, "grad_input", "cuda") == "cuda_core"  # any shape


def test_every_class_is_shipped_and_scaled():
    p = default_profile(load_gpu("a100-80gb-sxm"))
    # every class; the RGB stem's only where it was measured (Hopper)
    assert set(p.conv_efficiency) == set(CONV_CLASSES) - {"low_channel_forward"} and p.conv_efficiency_scale == 1.0
    assert set(default_profile(load_gpu("h100-sxm")).conv_efficiency) == set(CONV_CLASSES)
    half = p.replace(conv_efficiency_scale=0.5)
    assert half.conv_efficiency_of(2, 49, "grad_input") == pytest.approx(0.5 * p.conv_efficiency["other_grad_input"])
    assert p.replace(conv_efficiency={}).conv_efficiency_of(1, 3136, "forward") == 1.0  # a class left out


def test_a_profile_file_overrides_some_classes_and_bad_ones_fail(tmp_path):
    gpu = load_gpu("h100")
    path = tmp_path / "p.toml"
    path.write_text("conv_efficiency_scale = 0.9\n[conv_efficiency]\nother_grad_input = 0.8\n")
    p, base = load_profile(path, gpu), default_profile(gpu)
    assert p.conv_efficiency["other_grad_input"] == 0.8
    assert p.conv_efficiency["stride1_large"] == base.conv_efficiency["stride1_large"]  # merged
    assert p.conv_efficiency_of(2, 3136, "grad_input") == pytest.approx(0.72)
    save_profile(p, tmp_path / "round.toml")
    assert load_profile(tmp_path / "round.toml", gpu) == p
    path.write_text("[conv_efficiency]\nstrided = 0.5\n")
    with pytest.raises(UsageError, match="unknown convolution class 'strided'; valid: stride1_large"):
        load_profile(path, gpu)
    path.write_text("[conv_efficiency]\ncuda_core = 3\n")
    with pytest.raises(UsageError, match="cuda_core"):
        load_profile(path, gpu)


@pytest.fixture(scope="module")
def db():
    """``validation/deepbench_conv.py`` as a module (registered first: it defines a dataclass)."""
    spec = importlib.util.spec_from_file_location("deepbench_conv", ROOT / "validation" / "deepbench_conv.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def test_shipped_values_are_the_deepbench_medians(db):
    """Each shipped value is the pooled median its derivation gives from the committed CSVs,
    over at least 8 convolution passes. A change to the GEMM model moves these medians (the
    efficiency is relative to it): rerun ``python validation/deepbench_conv.py`` and update
    ``[default.conv_efficiency]``."""
    shipped = default_profile().conv_efficiency
    derived = {}
    for precision in ("fp16", "fp32"):
        _, passes = db.derive(precision)
        derived |= db.class_medians(passes)
    assert set(derived) == set(shipped)
    for key, (median, n) in derived.items():
        assert n >= 8, key
        assert shipped[key] == pytest.approx(median, abs=0.006), key


def test_the_csv_rows_agree_with_the_sheets_own_rates(db):
    """The extracted times reproduce the TFLOP/s the sheets print beside them (the extraction
    checked every row; here a few by hand): V100 fp16 forward 3x3, 28x28, C=256, K=512, N=16 took
    0.310 ms, 95.47 TFLOP/s in the sheet."""
    row = next(r for r in db.read_csv("conv.csv") if r["gpu"] == "v100-sxm2" and r["precision"] == "fp16"
               and (r["w"], r["c"], r["k"], r["n"], r["r"]) == ("28", "256", "512", "16", "3"))
    flops = 2 * 16 * 512 * 28 * 28 * 256 * 3 * 3
    assert flops / (float(row["fwd_ms"]) * 1e-3) / 1e12 == pytest.approx(95.47, rel=1e-3)
