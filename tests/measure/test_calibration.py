"""Calibration on the CPU with a tiny plan: profile, device description, atomic writes."""

from __future__ import annotations

import json

import pytest
import torch

from nnperf.hardware import load_gpu, load_profile
from nnperf.measure.calibration import (
    Outputs,
    Plan,
    new_calibration,
    run_calibration,
    write_outputs,
)
from nnperf.measure.calibration import benchmarks as calib_benchmarks

CPU = torch.device("cpu")
TINY = Plan(gemm_sizes=(32, 64), gemm_dtypes=("fp32",), skinny_m=8, conv_shapes=((2, 4, 8, 4, 3, 1),),
            conv_dtype="fp32", bandwidth_bytes=(2**14, 2**16), tiny_ops=200, transfer_bytes=(), repeats=2)


@pytest.fixture(scope="module")
def cal():
    return run_calibration(CPU, TINY, result=new_calibration(CPU, quick=True))


def test_raw_measurements(cal):
    assert cal.complete
    assert len(cal.gemm) == 2 * 3 and {g["kind"] for g in cal.gemm} == {"square", "misaligned", "skinny"}
    sq = next(g for g in cal.gemm if g["kind"] == "square" and g["k"] == 64)
    assert sq["flops"] == 2 * 64**3 and sq["flops_per_s"] == pytest.approx(sq["flops"] / sq["time_s"])
    mis = next(g for g in cal.gemm if g["kind"] == "misaligned" and g["k"] == 65)
    assert (mis["m"], mis["n"]) == (65, 65)
    conv = cal.conv[0]  # 2x4x8x8 input, 4 filters 3x3, pad 1: 8x8 output
    assert conv["flops"] == 2 * 2 * 4 * 8 * 8 * 4 * 3 * 3
    copy = [b for b in cal.bandwidth if b["kind"] == "copy"]
    assert [b["bytes_moved"] for b in copy] == [2 * 2**14, 2 * 2**16]
    assert cal.overhead["host_per_op_s"]["median"] > 0
    assert cal.transfer == []  # CUDA only


def test_outputs_load_and_hold_the_measurements(cal, tmp_path):
    out = Outputs.for_profile(tmp_path / "cpu.toml", None, cpu=True)
    write_outputs(cal, None, out)
    assert out.device == tmp_path / "cpu-device.toml" and out.raw == tmp_path / "cpu.json"
    gpu = load_gpu(None, gpu_file=out.device)
    best = max(g["flops_per_s"] for g in cal.gemm if g["dtype"] == "fp32")
    assert gpu.cuda_tflops["fp32"] == pytest.approx(best / 1e12)
    copy_best = max(b["bytes_per_s"] for b in cal.bandwidth if b["kind"] == "copy")
    assert gpu.memory_bandwidth == pytest.approx(copy_best)
    assert gpu.sm_count == torch.get_num_threads()
    prof = load_profile(out.profile, gpu)
    assert prof.kernel_overhead_s == pytest.approx(cal.overhead["host_per_op_s"]["median"])
    assert prof.host_dispatch_s < 1e-6  # CPU: the op's cost is charged serially as its kernel
    # efficiencies are measured rates over the best one, kept within [1e-4, 1] (a stalled
    # repeat on a busy machine must not write a zero the time model would divide by)
    squares = sorted((g["flops"], min(1.0, max(1e-4, g["flops_per_s"] / best)))
                     for g in cal.gemm if g["kind"] == "square")
    assert [pytest.approx(v) for v in prof.gemm_efficiency["fp32"]] == [tuple(s) for s in squares]
    raw = json.loads(out.raw.read_text())
    assert raw["schema"] == "nnperf.calibration/1" and raw["complete"] is True
    assert "[measured]" in out.profile.read_text()


def test_cpu_profile_reproduces_a_gemm_it_measured(cal, tmp_path):
    """The efficiency curve was measured at this very size: the estimate's compute time is that
    measurement, and its launch overhead the per-op cost measured apart. (A ratio of the two
    timings taken at different moments is not asserted: on a loaded machine the per-op cost
    alone moved it past any fixed bound.)"""
    from nnperf.kernels.gemm import estimate_gemm

    out = Outputs.for_profile(tmp_path / "p.toml", None, cpu=True)
    write_outputs(cal, None, out)
    gpu = load_gpu(None, gpu_file=out.device)
    est = estimate_gemm(64, 64, 64, dtype="fp32", gpu=gpu, profile=load_profile(out.profile, gpu))
    measured = next(g["time_s"] for g in cal.gemm if g["kind"] == "square" and g["k"] == 64)
    assert est.model_compute_s == pytest.approx(measured)
    assert est.overhead_s == pytest.approx(cal.overhead["host_per_op_s"]["median"])
    assert est.reduction_s == 0  # K = 64 is below split_k_min_k: no split-K
    assert est.time_s == pytest.approx(max(est.model_compute_s, est.model_memory_s) + est.overhead_s)


def test_incomplete_calibration_is_never_written(tmp_path, monkeypatch):
    partial = new_calibration(CPU, quick=True)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(calib_benchmarks, "_convs", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_calibration(CPU, TINY, result=partial)
    assert partial.gemm and not partial.complete
    with pytest.raises(ValueError):
        write_outputs(partial, None, Outputs.for_profile(tmp_path / "x.toml", None, cpu=True))
    assert list(tmp_path.iterdir()) == []


def test_noisy_measurements_are_named_worst_first():
    from nnperf.measure.calibration import Calibration

    cal = Calibration(device="cpu", device_name="x", quick=True, date="d", torch_version="t", threads=1)
    cal.gemm = [
        {"kind": "square", "dtype": "fp32", "n": 64, "spread": {"p10": 1.0, "p90": 1.5}},  # 1.5x: fine
        {"kind": "square", "dtype": "fp32", "n": 128, "spread": {"p10": 1.0, "p90": 5.0}},
    ]
    cal.bandwidth = [{"kind": "copy", "bytes_moved": 1024, "spread": {"p10": 2.0, "p90": 6.0}}]
    assert [(w, r) for w, r in cal.noisy()] == [("gemm square fp32 128", 5.0), ("bandwidth copy 1024", 3.0)]
    assert [n["what"] for n in cal.to_json()["noisy"]] == ["gemm square fp32 128", "bandwidth copy 1024"]


def test_the_attention_benchmark_times_flex_attention_on_cuda_only():
    """One row per kernel and shape: SDPA's flash, memory-efficient and cuDNN backends, then
    compiled FlexAttention, which has neither fused kernels nor a backward on a CPU: recorded as skipped,
    with the reason, so a CPU calibration leaves the published share in place."""
    rows = list(calib_benchmarks._attention_rows((1, 2, 256, 16, 16), torch.device("cpu"), repeats=2))
    assert [r["backend"] for r in rows] == ["flash", "efficient", "cudnn", "flex"]
    assert "CUDA" in rows[3]["skipped"] and "forward_s" not in rows[3]
