"""Kernel-bench rows into profile constants: a synthetic bench whose times the model gives for
known constants must give those constants back."""

from __future__ import annotations

import json

import pytest

from nnperf.errors import UsageError
from nnperf.hardware import default_profile, load_gpu
from nnperf.kernels import batch_norm as bn
from nnperf.kernels.native_loops import loop_kernel_time
from nnperf.measure.calibration import Calibration
from nnperf.measure.calibration.kernel_bench import (
    SCHEMA,
    kernel_bench_changes,
    load_kernel_bench,
    loop_cycles,
)
from nnperf.measure.calibration.profile import build_profile
from nnperf.measure.calibration.record import TIMING_DEVICE

H200 = load_gpu("h200-sxm")


def _bn_rows(cycles: float) -> list[dict]:
    """The native NCHW rows of one shape, timed by the model at ``cycles`` per iteration."""
    profile = default_profile(H200).replace(loop_iteration_cycles=cycles)
    facts = {"kind": "batch_norm", "dtype": "bf16", "parameter_dtype": "fp32", "layout": "nchw", "batch": 64,
             "channels": 64, "hw": 112, "cudnn_benchmark": False}

    def seconds(training: bool, backward: bool) -> float:
        call = bn.BatchNormCall(batch=64, channels=64, spatial=112 * 112, itemsize=2, input_dtype="bf16",
                                weight_dtype="fp32", has_bias=True, running_stats=True, training=training,
                                backward=backward, want_input_grad=True, want_param_grads=True,
                                channels_last=False, contiguous=True, eps=1e-5, numel=64 * 64 * 112 * 112)
        plan = bn.launches(call, cudnn=False)
        return (sum(loop_kernel_time(k, H200, profile) for k in plan.loops)
                + plan.kernels * profile.kernel_overhead_s)

    forward = seconds(True, False)
    ops = {"aten.native_batch_norm": 1}
    return [{**facts, "pass": "forward", "ops": ops, "time_s": forward},
            {**facts, "pass": "forward_backward", "ops": {**ops, "aten.native_batch_norm_backward": 1},
             "time_s": forward + seconds(True, True)},
            {**facts, "pass": "eval", "ops": ops, "time_s": seconds(False, False)},
            {**facts, "layout": "channels_last", "pass": "forward", "ops": ops, "time_s": 1.0},  # not a loop
            {**facts, "dtype": "fp16", "pass": "forward", "ops": {"aten.cudnn_batch_norm": 1}, "time_s": 1.0}]


def test_the_round_trip_comes_back_from_rows_timed_with_it():
    assert loop_cycles(_bn_rows(800.0), H200, default_profile(H200)) == pytest.approx(800.0, rel=1e-6)
    assert loop_cycles(_bn_rows(350.0), H200, default_profile(H200)) == pytest.approx(350.0, rel=1e-6)


def test_cudnns_round_trip_is_a_fraction_of_the_native_one():
    profile = default_profile(H200).replace(loop_iteration_cycles=900.0, cudnn_batch_norm_loop_fraction=0.5)
    facts = {"kind": "batch_norm", "dtype": "fp16", "parameter_dtype": "fp32", "layout": "nchw", "batch": 64,
             "channels": 64, "hw": 112, "cudnn_benchmark": False}

    def seconds(backward: bool) -> float:
        call = bn.BatchNormCall(batch=64, channels=64, spatial=112 * 112, itemsize=2, input_dtype="fp16",
                                weight_dtype="fp32", has_bias=True, running_stats=True, training=True,
                                backward=backward, want_input_grad=True, want_param_grads=True,
                                channels_last=False, contiguous=True, eps=1e-5, numel=64 * 64 * 112 * 112)
        plan = bn.launches(call, cudnn=True)
        return sum(loop_kernel_time(k, H200, profile) for k in plan.loops) + plan.kernels * profile.kernel_overhead_s

    ops = {"aten.cudnn_batch_norm": 1}
    cudnn = [{**facts, "pass": "forward", "ops": ops, "time_s": seconds(False)},
             {**facts, "pass": "forward_backward", "ops": {**ops, "aten.cudnn_batch_norm_backward": 1},
              "time_s": seconds(False) + seconds(True)}]
    # timed at 450 cycles (900 x 0.5): the solve reads the loop's own round trip
    assert loop_cycles(cudnn, H200, default_profile(H200), library="cudnn") == pytest.approx(450.0, rel=1e-6)
    doc = {"schema": SCHEMA, "rows": [*_bn_rows(900.0)[:3], *cudnn]}
    changes = kernel_bench_changes(doc, H200, default_profile(H200))
    assert changes["cudnn_batch_norm_loop_fraction"] == pytest.approx(0.5, rel=1e-6)


def test_rows_the_bandwidth_floor_explains_inform_nothing():
    rows = [dict(r, time_s=1e-9) for r in _bn_rows(800.0)]
    assert loop_cycles(rows, H200, default_profile(H200)) is None


def test_depthwise_and_stem_rows_set_their_constants():
    per_second = 132 * 1980e6
    macs = 32 * 144 * 56 * 56 * 9
    depthwise = {"kind": "depthwise", "dtype": "bf16", "tf32": False, "layout": "nchw", "batch": 32,
                 "in_channels": 144, "out_channels": 144, "hw": 56, "kernel": 3, "stride": 1, "groups": 144,
                 "input_grad": True, "pass": "forward", "cudnn_benchmark": False, "time_s": macs / (4.0 * per_second)}
    tuned = dict(depthwise, cudnn_benchmark=True, time_s=1.0)  # benchmark-on rows inform nothing yet
    doc = {"schema": SCHEMA, "rows": [*_bn_rows(700.0), depthwise, tuned]}
    changes = kernel_bench_changes(doc, H200, default_profile(H200))
    assert changes["loop_iteration_cycles"] == pytest.approx(700.0, rel=1e-6)
    assert changes["depthwise_rate"]["native_bf16"][0][1] == pytest.approx(4.0)
    assert changes["depthwise_rate"]["cudnn_bf16"] == default_profile(H200).depthwise_rate["cudnn_bf16"]
    cal = Calibration(device="cuda:0", device_name="NVIDIA H200", quick=False, date="d", torch_version="t",
                      threads=1, timing=TIMING_DEVICE, complete=True)
    profile = build_profile(cal, H200, doc)
    assert profile.loop_iteration_cycles == pytest.approx(700.0, rel=1e-6) and "kernel-bench" in profile.note


def test_a_file_that_is_not_a_kernel_bench_is_refused(tmp_path):
    bad = tmp_path / "other.json"
    bad.write_text(json.dumps({"schema": "nnperf.calibration/1", "rows": []}))
    with pytest.raises(UsageError, match="not a kernel-bench file"):
        load_kernel_bench(bad)
    bad.write_text("{")
    with pytest.raises(UsageError, match="is not JSON"):
        load_kernel_bench(bad)
    with pytest.raises(UsageError, match="cannot read it"):
        load_kernel_bench(tmp_path / "missing.json")
