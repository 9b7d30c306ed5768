"""The cuDNN RNN time model (``kernels.rnn``): PyTorch's algorithm choice, one GEMM-model
launch per sequential step, independent chains side by side, persistent kernels."""

from __future__ import annotations

import pytest

from nnperf.hardware import default_profile, load_gpu
from nnperf.kernels.gemm import estimate_gemm
from nnperf.kernels.rnn import (
    BACKWARD_DATA,
    BACKWARD_WEIGHTS,
    FORWARD,
    PERSIST_STATIC,
    PERSIST_STATIC_SMALL_H,
    STANDARD,
    RnnGeometry,
    cudnn_algorithm,
    estimate_rnn,
)

H100, A100, A10, V100, T4 = (load_gpu(n) for n in ("h100", "a100", "a10", "v100", "t4"))


def lstm(hidden=512, input_size=512, layers=1, bidirectional=False, batch=64, seq=50, proj=0, steps=None):
    return RnnGeometry("lstm", input_size, hidden, proj, layers, bidirectional,
                       tuple(steps) if steps else (batch,) * seq)


@pytest.mark.parametrize("geometry, dtype, gpu, forward, expected", [
    # use_rnn_persist_small_h: LSTM/GRU hidden <= 192 forward, <= 128 backward
    (lstm(hidden=128), "fp32", H100, True, PERSIST_STATIC_SMALL_H),
    (lstm(hidden=160), "fp32", H100, True, PERSIST_STATIC_SMALL_H),
    (lstm(hidden=160), "fp32", H100, False, STANDARD),
    (RnnGeometry("rnn_tanh", 64, 384, 0, 1, False, (8,) * 10), "fp16", H100, True, PERSIST_STATIC_SMALL_H),
    (lstm(hidden=128), "fp64", H100, True, STANDARD),  # not for double
    # fp16, one unidirectional layer, hidden and input multiples of 128: device rules
    (lstm(), "fp16", A100, True, PERSIST_STATIC),  # sm_80, 108 SMs >= 98, batch % 8, <= 128
    (lstm(), "fp16", A10, True, STANDARD),  # sm_86 excluded
    (lstm(), "fp16", V100, True, PERSIST_STATIC),  # Volta: batch 64, seq >= 40
    (lstm(seq=15), "fp16", V100, True, STANDARD),  # batch 64 needs seq >= 20 there (<= 96)
    (lstm(), "fp16", T4, True, STANDARD),  # Turing excluded
    (lstm(), "fp32", A100, True, STANDARD),  # PERSIST_STATIC is for fp16 only
    (lstm(layers=2), "fp16", A100, True, STANDARD),
    (lstm(batch=136), "fp16", A100, True, STANDARD),
    (RnnGeometry("gru", 512, 512, 0, 1, False, (64,) * 50), "fp16", A100, True, STANDARD),
    # projections and varying lengths: standard only
    (lstm(hidden=128, proj=64), "fp32", H100, True, STANDARD),
    (lstm(hidden=128, steps=[4, 4, 3, 1]), "fp32", H100, True, STANDARD),
])
def test_algorithm_follows_pytorchs_get_algo(geometry, dtype, gpu, forward, expected):
    assert cudnn_algorithm(geometry, dtype, gpu, forward) == expected


def _gemm(gpu, dtype="bf16"):
    profile = default_profile(gpu)
    return profile, lambda m, n, k: estimate_gemm(m, n, k, dtype=dtype, gpu=gpu, profile=profile)


def test_standard_recurrence_is_one_gemm_and_one_pointwise_kernel_per_step():
    g = lstm(hidden=1024, input_size=1024, batch=32, seq=20)
    profile, gemm = _gemm(H100)
    est = estimate_rnn(g, FORWARD, 2, STANDARD, H100, profile, gemm)
    assert est.kernels == 1 + 2 * 20
    step = gemm(32, 4 * 1024, 1024).time_s
    big = gemm(32 * 20, 4 * 1024, 1024).time_s
    pointwise = profile.memory_time(H100.memory_bandwidth, 2 * 32 * (2 * 4096 + 1024 + 1024 + 1024 + 4096))
    assert est.time_s == pytest.approx(big + 20 * (step + pointwise + profile.kernel_overhead_s))
    # the same FLOPs as one GEMM would take far less: the steps are sequential launches
    assert est.time_s > 3 * gemm(32 * 20, 4 * 1024, 2 * 1024).time_s


def test_longer_sequences_add_steps_linearly():
    profile, gemm = _gemm(H100)
    t = [estimate_rnn(lstm(seq=s), FORWARD, 2, STANDARD, H100, profile, gemm).time_s for s in (50, 100, 200)]
    assert t[2] - t[1] == pytest.approx(2 * (t[1] - t[0]), rel=0.05)


def test_small_chains_run_side_by_side():
    """Two directions of a small layer fit on the SMs together: a bidirectional layer's
    recurrence costs one direction's; a wavefront runs a 4-layer unidirectional stack in
    T + 3 steps instead of 4T."""
    profile, gemm = _gemm(H100)
    one = estimate_rnn(lstm(hidden=256, input_size=256, batch=16), FORWARD, 2, STANDARD, H100, profile, gemm)
    bi = estimate_rnn(lstm(hidden=256, input_size=256, batch=16, bidirectional=True), FORWARD, 2, STANDARD,
                      H100, profile, gemm)
    step = one.time_s - gemm(16 * 50, 1024, 256).time_s
    assert bi.time_s == pytest.approx(2 * gemm(16 * 50, 1024, 256).time_s + step)
    four = estimate_rnn(lstm(hidden=256, input_size=256, batch=16, layers=4), FORWARD, 2, STANDARD,
                        H100, profile, gemm)
    inputs = gemm(16 * 50, 1024, 256).time_s * 4
    assert four.time_s - inputs == pytest.approx(step * (50 + 3) / 50)


def test_persistent_kernel_pays_one_launch_and_no_weight_traffic_per_step():
    g = lstm(hidden=128, input_size=128, batch=8)
    profile, gemm = _gemm(H100, "fp16")
    standard = estimate_rnn(g, FORWARD, 2, STANDARD, H100, profile, gemm)
    persistent = estimate_rnn(g, FORWARD, 2, PERSIST_STATIC_SMALL_H, H100, profile, gemm)
    assert persistent.kernels == 2  # the input GEMM and one persistent kernel
    assert persistent.time_s < standard.time_s
    step = gemm(8, 512, 128)
    assert persistent.time_s > 50 * step.model_compute_s  # still one step after the other


def test_backward_parts():
    g = lstm(hidden=256, input_size=128, batch=16, seq=10)
    profile, gemm = _gemm(H100)
    data = estimate_rnn(g, BACKWARD_DATA, 2, STANDARD, H100, profile, gemm)
    weights = estimate_rnn(g, BACKWARD_WEIGHTS, 2, STANDARD, H100, profile, gemm)
    assert data.kernels == 2 * 10 + 1  # per step a GEMM and the gate-gradient kernel, then dx
    assert weights.kernels == 2 + 1  # dW_ih, dW_hh over every token, and the bias sums
    assert [(x.m, x.n, x.k) for x, _ in weights.gemms] == [(1024, 128, 160), (1024, 256, 160)]
