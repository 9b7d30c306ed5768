"""Device profiles: generic defaults as data, per-architecture refinements, measured curves."""

from __future__ import annotations

import math

import pytest

from nnperf.errors import UsageError
from nnperf.hardware import default_profile, load_gpu, load_profile, save_profile
from nnperf.hardware.profile import interpolate


def test_defaults_come_from_the_data_file():
    p = default_profile()
    assert 0.75 <= p.gemm_peak_fraction <= 0.85
    assert 0.8 <= p.bandwidth_fraction <= 0.92
    assert 2e-6 <= p.kernel_overhead_s <= 5e-6
    assert 5e-6 <= p.host_dispatch_s <= 20e-6
    assert p.tiles()[0] in {(256, 128), (128, 256)} and p.tiles()[-1] == (64, 64)


def test_architecture_refinement():
    hopper, ampere = default_profile(load_gpu("h100")), default_profile(load_gpu("a100"))
    assert hopper.attention_forward_fraction < ampere.attention_forward_fraction  # [architecture.hopper]
    assert default_profile(load_gpu("mi300x")).gemm_peak_fraction != ampere.gemm_peak_fraction  # cdna3
    assert default_profile(load_gpu("v100")).alignment_penalty["16B"] == 0.25
    assert default_profile(load_gpu("v100")).alignment_penalty["128B"] == 0.95  # merged


def test_interpolation_is_linear_in_log_x():
    curve = [(1e3, 1.0), (1e5, 3.0)]
    assert interpolate(curve, 1e4) == pytest.approx(2.0)  # halfway in log10
    assert interpolate(curve, 10**3.5) == pytest.approx(1.5)
    assert interpolate(curve, 1.0) == 1.0 and interpolate(curve, 1e9) == 3.0


def test_bandwidth_size_dependence_and_curve_override():
    p = default_profile()
    peak = 1e12
    half = p.bandwidth_half_bytes
    assert p.achievable_bandwidth(peak, half) == pytest.approx(peak * p.bandwidth_fraction / 2)
    measured = p.replace(bandwidth_curve=((1e3, 1e9), (1e9, 9e11)))
    assert measured.achievable_bandwidth(peak, 1e6) == pytest.approx(1e9 + 0.5 * (9e11 - 1e9))


def test_save_and_load_round_trip(tmp_path):
    gpu = load_gpu("h200")
    p = default_profile(gpu).replace(
        gemm_peak_fraction=0.77,
        bandwidth_curve=((4096.0, 1e9), (2.0**30, 4.3e12)),
        gemm_efficiency={"bf16": ((1e9, 0.3), (1e12, 0.78))},
        note='measured "today"',
    )
    path = tmp_path / "h200.toml"
    save_profile(p, path)
    assert load_profile(path, gpu) == p
    assert math.isclose(load_profile(path, gpu).math_fraction("tensor", "bf16", 1e12), 0.78)


def test_partial_profile_keeps_defaults_and_bad_fields_fail(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text("kernel_overhead_s = 4e-6\n")
    p = load_profile(path)
    assert (
        p.kernel_overhead_s == 4e-6 and p.gemm_peak_fraction == default_profile().gemm_peak_fraction
    )
    path.write_text("gemm_peak_fraction = -1\n")
    with pytest.raises(UsageError, match=r"p.toml.*gemm_peak_fraction"):
        load_profile(path)
    path.write_text("gemm_peak_fractoin = 0.7\n")
    with pytest.raises(UsageError, match="unknown field 'gemm_peak_fractoin'"):
        load_profile(path)


def test_one_efficient_attention_share_sets_both_passes(tmp_path):
    """Profiles calibrated before the memory-efficient kernel's share was split by pass hold
    one ``efficient_attention_scale``: it stands for both; out of range it is one line."""
    path = tmp_path / "p.toml"
    path.write_text("efficient_attention_scale = 0.4\n")
    p = load_profile(path, load_gpu("h100"))
    assert p.efficient_attention_forward_scale == p.efficient_attention_backward_scale == 0.4
    path.write_text("efficient_attention_backward_scale = 0.3\nefficient_attention_scale = 0.4\n")
    p = load_profile(path, load_gpu("h100"))  # a per-pass field beside it wins, in any order
    assert (p.efficient_attention_forward_scale, p.efficient_attention_backward_scale) == (0.4, 0.3)
    path.write_text("efficient_attention_scale = 1.5\n")
    with pytest.raises(UsageError, match="efficient_attention_scale"):
        load_profile(path)


def _h200_attention_rows() -> list[dict]:
    import json
    from pathlib import Path

    raw = json.loads((Path(__file__).parents[2] / "validation/data/h200-sxm/profile.json").read_text())
    return [r for r in raw["attention"] if r.get("forward_s")]


def test_hopper_attention_defaults_are_the_h200_microbenchmark():
    """[architecture.hopper]'s attention numbers, worked out here from the committed H200 rows
    (bf16, causal, 16 heads): flash's FLOP rates over the 989.4 TFLOP/s peak (backward with its
    recomputed Q@K^T), the efficient kernel's time share of flash, and at head dim 192/128 each
    kernel pass's rate over its own at 128/128 on the same batch and tokens; to 2 decimals."""
    import statistics

    rows, peak = _h200_attention_rows(), 989.4e12
    hopper = default_profile(load_gpu("h100"))

    def forward_rate(r):
        return r["forward_flops"] / r["forward_s"]

    def backward_rate(r):
        return (r["backward_flops"] + r["recompute_flops"]) / r["backward_s"]

    flash = [r for r in rows if r["backend"] == "flash"]
    assert hopper.attention_forward_fraction == pytest.approx(
        statistics.median(forward_rate(r) / peak for r in flash), abs=0.005)
    assert hopper.attention_backward_fraction == pytest.approx(
        statistics.median(backward_rate(r) / peak for r in flash), abs=0.005)
    narrow = {(r["backend"], r["batch"], r["tokens"]): r for r in rows if r["head_dim"] == 128}
    for phase, scale in (("forward", hopper.efficient_attention_forward_scale),
                         ("backward", hopper.efficient_attention_backward_scale)):
        shares = [narrow["flash", r["batch"], r["tokens"]][f"{phase}_s"] / r[f"{phase}_s"]
                  for r in rows if r["backend"] == "efficient" and r["head_dim"] == 128]
        assert scale == pytest.approx(statistics.median(shares), abs=0.005)
    wide = [r for r in rows if r["head_dim"] == 192]
    assert {r["backend"] for r in wide} == {"efficient", "flex"}  # flash has no 192/128 kernel
    for r in wide:
        base = narrow[r["backend"], r["batch"], r["tokens"]]
        assert hopper.wide_head_attention[f"{r['backend']}_forward"] == pytest.approx(
            forward_rate(r) / forward_rate(base), abs=0.005)
        assert hopper.wide_head_attention[f"{r['backend']}_backward"] == pytest.approx(
            backward_rate(r) / backward_rate(base), abs=0.005)


def test_wide_heads_scale_only_the_kernels_measured_wide(tmp_path):
    """Up to head dim 128 no kernel is scaled; above it, a pass the table names is, and flash
    (no table entry) is not. Ampere takes the efficient kernel's shares (one kernel design)
    but not FlexAttention's (Triton configurations differ by architecture). A name outside the
    table is refused with the valid ones."""
    hopper, ampere = default_profile(load_gpu("h100")), default_profile(load_gpu("a100"))
    assert hopper.attention_head_scale("efficient", True, 128) == 1.0
    assert hopper.attention_head_scale("efficient", True, 192) == hopper.wide_head_attention["efficient_backward"] < 1
    assert hopper.attention_head_scale("flex", False, 256) == hopper.wide_head_attention["flex_forward"] < 1
    assert hopper.attention_head_scale("flash", False, 256) == 1.0
    assert ampere.attention_head_scale("efficient", False, 192) == hopper.attention_head_scale("efficient", False, 192)
    assert ampere.attention_head_scale("flex", True, 192) == 1.0
    path = tmp_path / "p.toml"
    path.write_text("[wide_head_attention]\nflash_forward = 0.5\n")
    with pytest.raises(UsageError, match=r"unknown kernel pass .flash_forward.*efficient_forward"):
        load_profile(path)


def test_hopper_fp8_gemms_reach_bf16s_fraction_scaled_by_the_published_ratio():
    """FP8 on Hopper: bf16's fraction times MAMF's H100 SXM float8 efficiency over its bf16 one
    (validation/published/mamf.toml, the quoted rows); other dtypes and GPUs unchanged."""
    from pathlib import Path

    import tomllib

    rows = {r["id"]: r for r in tomllib.loads(
        (Path(__file__).resolve().parents[2] / "validation" / "published" / "mamf.toml").read_text())["measurement"]}
    fp8, bf16 = rows["mamf-float8-h100-sxm"], rows["mamf-bf16-h100-sxm"]
    ratio = (fp8["value"] / fp8["datasheet_tflops"]) / (bf16["value"] / bf16["datasheet_tflops"])
    hopper = default_profile(load_gpu("h100"))
    assert hopper.math_fraction("tensor", "fp8", 1e12) == pytest.approx(hopper.gemm_peak_fraction * ratio, abs=0.005)
    assert hopper.math_fraction("tensor", "bf16", 1e12) == hopper.gemm_peak_fraction
    assert default_profile(load_gpu("a100")).gemm_peak_fraction_by_dtype == {}
