"""What calibrate records beside the kernel rates: the host CPU (its dispatch cost per op
category and clock), the GPU's SM clock under sustained load, and the misaligned-GEMM penalty."""

from __future__ import annotations

import pytest

from nnperf.hardware import default_profile, load_gpu
from nnperf.measure.calibration import Calibration, host_info
from nnperf.measure.calibration.profile import build_profile, host_costs_by_category, measured_table


def _cal(**extra) -> Calibration:
    return Calibration(device="cuda:0", device_name="x", quick=True, date="d", torch_version="t", threads=1,
                       **extra)


def _spread(median: float) -> dict[str, float]:
    return {"median": median, "p10": median, "p90": median, "n": 3}


def test_measured_kinds_become_category_costs():
    cal = _cal()
    cal.overhead["host_per_op_by_kind_s"] = {
        "add": _spread(6e-6), "mul_": _spread(8e-6), "mm": _spread(9e-6), "layer_norm": _spread(12e-6),
        "cat": _spread(10e-6), "index_select": _spread(14e-6), "sum": _spread(7e-6), "softmax": _spread(9e-6)}
    by = host_costs_by_category(cal)
    assert by == pytest.approx({"elementwise": 7e-6, "gemm": 9e-6, "norm": 12e-6, "memory": 12e-6,
                                "reduction": 8e-6})
    cal.host_cpu, cal.host_max_ghz = "AMD EPYC 7742 64-Core Processor", 3.4
    profile = build_profile(cal, load_gpu("a100"))
    assert {k: profile.host_dispatch_by_kind_s[k] for k in by} == pytest.approx(by)
    assert profile.host_turbo_ghz == 3.4 and profile.host.startswith("AMD EPYC 7742")
    # a category it did not measure keeps the default's (conv: pytorch#51390)
    assert profile.host_dispatch_by_kind_s["conv"] == default_profile(load_gpu("a100")).host_dispatch_by_kind_s["conv"]


def test_clock_under_load_is_sampled_while_the_work_runs(monkeypatch):
    clocks = [1410.0, 1350.0, 1290.0, 1305.0]
    monkeypatch.setattr(host_info, "sm_clock_mhz", lambda index: clocks[len(calls) // 8 % 4])
    calls = []
    got = host_info.clock_under_load(lambda: calls.append(1), lambda: None, 0, seconds=0.01)
    assert got["samples"] >= 1 and len(calls) == 8 * got["samples"]
    seen = [clocks[i % 4] for i in range(1, got["samples"] + 1)]  # read after each 8 calls
    assert (got["min"], got["max"]) == (min(seen), max(seen))
    cal = _cal(clock_under_load_mhz={"median": 1305.0, "min": 1290.0, "max": 1410.0})
    assert measured_table(cal)["sm_clock_under_load_mhz"] == 1305.0


def test_no_clock_reader_records_nothing(monkeypatch):
    monkeypatch.setattr(host_info, "sm_clock_mhz", lambda index: None)
    assert host_info.clock_under_load(lambda: None, lambda: None, 0, seconds=0.01) == {}


def test_this_host_is_described():
    assert host_info.cpu_model()
    ghz = host_info.cpu_max_ghz()
    assert ghz is None or 0.1 < ghz < 10


def test_misaligned_gemms_measure_the_alignment_penalty():
    from nnperf.hardware import default_profile
    from nnperf.kernels.gemm import estimate_gemm
    from nnperf.measure.calibration.profile import misaligned_penalty

    gpu = load_gpu("a100")
    base = default_profile(gpu)
    neutral = base.replace(alignment_penalty={**base.alignment_penalty, "16B": 1.0})

    def row(kind: str, n: int, time_s: float) -> dict:
        return {"dtype": "bf16", "kind": kind, "m": n, "n": n, "k": n, "flops": 2.0 * n**3, "time_s": time_s,
                "flops_per_s": 2.0 * n**3 / time_s}

    cal = _cal()
    for n, penalty in ((2048, 0.7), (4096, 0.74), (1024, 0.3)):  # 1024: too small, not used
        aligned = estimate_gemm(n, n, n, dtype="bf16", gpu=gpu, profile=neutral).time_s
        odd = estimate_gemm(n + 1, n + 1, n + 1, dtype="bf16", gpu=gpu, profile=neutral).time_s / penalty
        cal.gemm += [row("square", n, aligned), row("misaligned", n + 1, odd)]
    assert misaligned_penalty(cal, gpu, base) == pytest.approx(0.72)  # median of 0.70 and 0.74
    assert build_profile(cal, gpu).alignment_penalty["16B"] == pytest.approx(0.72)
    assert misaligned_penalty(_cal(), gpu, base) is None
    # each dtype gets its own median beside the overall one (here the only dtype: the same)
    assert build_profile(cal, gpu).alignment_penalty["16B.bf16"] == pytest.approx(0.72)


def test_a_dtypes_own_alignment_penalty_wins_over_the_class():
    from nnperf.hardware import default_profile
    from nnperf.kernels.gemm import estimate_gemm

    gpu = load_gpu("a100")
    base = default_profile(gpu)
    split = base.replace(alignment_penalty={**base.alignment_penalty, "16B": 0.5, "16B.tf32": 0.25})
    odd = {"m": 8192, "n": 50257, "k": 768}  # GPT-2's vocabulary: N not a multiple of 8
    assert estimate_gemm(**odd, dtype="fp32", tf32=True, gpu=gpu, profile=split).alignment_factor == 0.25
    assert estimate_gemm(**odd, dtype="bf16", gpu=gpu, profile=split).alignment_factor == 0.5


def test_measured_convolutions_scale_the_efficiency_table():
    """Each measured forward convolution, relative to the GEMM rate at its FLOPs, over its
    class's table value: the median is the profile's uniform scale (the table keeps its shape)."""
    gpu = load_gpu("a100")
    cal = _cal()
    cal.gemm = [{"dtype": "bf16", "kind": "square", "n": n, "flops": 2.0 * n**3, "flops_per_s": 200e12}
                for n in (1024, 8192)]

    def conv(hw: int, kernel: int, stride: int, ratio: float) -> dict:
        return {"dtype": "bf16", "hw": hw, "kernel": kernel, "stride": stride, "flops": 1e10,
                "flops_per_s": ratio * 200e12}

    table = build_profile(_cal(), gpu).conv_efficiency
    # 56x56 stride 1 (large), 7x7 stride 1 (small: 49 positions), 224 -> 112 stride 2
    cal.conv = [conv(56, 3, 1, 0.9 * table["stride1_large"]), conv(7, 3, 1, 0.8 * table["other_forward"]),
                conv(224, 7, 2, 1.1 * table["other_forward"])]
    profile = build_profile(cal, gpu)
    assert profile.conv_efficiency_scale == pytest.approx(0.9)  # median of 0.9, 0.8, 1.1
    assert profile.conv_efficiency == table
    assert build_profile(_cal(), gpu).conv_efficiency_scale == 1.0  # nothing measured: the default


def test_measured_attention_sets_the_fractions_and_the_efficient_share():
    """Flash's forward rate and its backward rate (with the recomputed Q@K^T) over the bf16
    peak, medians over the shapes; the efficient kernel's share: flash's time over its own on
    the same shape. A shape only the efficient kernel takes (192/128) informs no share of
    flash; against the efficient kernel's own 128/128 row it gives the wide-head shares."""
    gpu = load_gpu("h100")
    peak = 989.4e12  # the datasheet's: a microbenchmark's short bursts run at the quoted clock

    def row(backend: str, tokens: int, e: int, fwd_rate: float, bwd_rate: float) -> dict:
        pairs = 8 * 16 * tokens * (tokens + 1) // 2
        f, b, r = 2.0 * pairs * (e + 128), 4.0 * pairs * (e + 128), 2.0 * pairs * e
        return {"backend": backend, "batch": 8, "heads": 16, "tokens": tokens, "head_dim": e, "head_dim_v": 128,
                "forward_flops": f, "backward_flops": b, "recompute_flops": r,
                "forward_s": f / (fwd_rate * peak), "backward_s": (b + r) / (bwd_rate * peak)}

    cal = _cal()
    cal.attention = [row("flash", 4096, 128, 0.40, 0.30), row("flash", 8192, 128, 0.44, 0.34),
                     row("efficient", 4096, 128, 0.20, 0.15), row("efficient", 8192, 128, 0.33, 0.255),
                     row("efficient", 4096, 192, 0.05, 0.05),
                     {"backend": "flash", "batch": 8, "heads": 16, "tokens": 4096, "head_dim": 192,
                      "head_dim_v": 128, "skipped": "No available kernel"}]
    profile = build_profile(cal, gpu)
    assert profile.attention_forward_fraction == pytest.approx(0.42)  # median of 0.40 and 0.44
    assert profile.attention_backward_fraction == pytest.approx(0.32)
    # same work: share = flash time / efficient time, per pass; 4096: 0.5 (both rates halved);
    # 8192: 0.75 (0.33 / 0.44 forward, 0.255 / 0.34 backward)
    assert profile.efficient_attention_forward_scale == pytest.approx((0.5 + 0.75) / 2)
    assert profile.efficient_attention_backward_scale == pytest.approx((0.5 + 0.75) / 2)
    table = measured_table(cal)
    assert table["sdpa_efficient_d192_128_s4096_forward_tflops"] == pytest.approx(0.05 * peak / 1e12)
    # 192/128 at 0.05 of the peak both ways, against 0.20 and 0.15 at 128/128 on 4096 tokens
    assert profile.wide_head_attention == pytest.approx({"efficient_forward": 0.25, "efficient_backward": 1 / 3,
                                                         "flex_forward": 0.74, "flex_backward": 0.29})
    assert profile.flex_attention_forward_scale == 1.08  # nothing measured: Hopper's default
    # FlexAttention: forward in 0.8 of flash's time, backward in 1.25 of it, on 4096 causal
    # tokens: 32 blocks a side, 32 * 33 / 2 computed, against 4096 * 4097 / 2 pairs kept
    flash = cal.attention[0]
    executed = 8 * 16 * 32 * 33 // 2 * 128 * 128
    kept = 8 * 16 * 4096 * 4097 // 2
    cal.attention.append({**flash, "backend": "flex", "executed_pairs": executed,
                          "forward_s": 0.8 * flash["forward_s"], "backward_s": 1.25 * flash["backward_s"]})
    measured = build_profile(cal, gpu)
    assert measured.flex_attention_forward_scale == pytest.approx(executed / kept / 0.8)
    assert measured.flex_attention_backward_scale == pytest.approx(executed / kept / 1.25)
    assert measured_table(cal)["flex_d128_128_s4096_forward_tflops"] == pytest.approx(0.40 / 0.8 * peak / 1e12)
    # cuDNN: forward in 0.6 of flash's time, backward in 0.5 of it: shares 1/0.6 and 2, above 1
    cal.attention.append({**flash, "backend": "cudnn", "forward_s": 0.6 * flash["forward_s"],
                          "backward_s": 0.5 * flash["backward_s"]})
    with_cudnn = build_profile(cal, gpu)
    assert with_cudnn.cudnn_attention_forward_scale == pytest.approx(1 / 0.6)
    assert with_cudnn.cudnn_attention_backward_scale == pytest.approx(2.0)
    assert measured.cudnn_attention_forward_scale == 1.74  # nothing measured: Hopper's default
    unmeasured = build_profile(_cal(), gpu)  # the defaults stand: Hopper's
    assert (unmeasured.attention_forward_fraction, unmeasured.attention_backward_fraction,
            unmeasured.efficient_attention_forward_scale, unmeasured.efficient_attention_backward_scale) == \
        (0.31, 0.27, 0.53, 0.45)
    assert unmeasured.wide_head_attention == default_profile(gpu).wide_head_attention


def test_dtensor_costs_come_from_the_measurement_and_move_with_the_host():
    """The measured medians become the profile's DTensor costs on a GPU; a CPU profile keeps
    none (its host does not run beside a device); --host rescales them with the other host
    costs, by the ratio of clocks."""
    from nnperf.hardware.host import load_host, with_host

    cal = _cal()
    cal.overhead["dtensor"] = {"dispatch_s": _spread(8e-5), "list_tensor_s": _spread(2e-6), "dispatches": 375}
    cal.host_max_ghz = 2.0
    profile = build_profile(cal, load_gpu("h100"))
    assert (profile.host_dtensor_dispatch_s, profile.host_dtensor_list_tensor_s) == (8e-5, 2e-6)
    table = measured_table(cal)  # the profile's [measured] table shows both, in microseconds
    assert (table["host_dtensor_dispatch_us"], table["host_dtensor_list_tensor_us"]) == pytest.approx((80.0, 2.0))
    cpu = build_profile(cal, None)
    assert (cpu.host_dtensor_dispatch_s, cpu.host_dtensor_list_tensor_s) == (0.0, 0.0)
    moved = with_host(profile, load_host("xeon-8480c"))  # 3.8 GHz
    assert moved.host_dtensor_dispatch_s == pytest.approx(8e-5 * 2.0 / 3.8)
    assert moved.host_dtensor_list_tensor_s == pytest.approx(2e-6 * 2.0 / 3.8)
