"""Figures the prediction issue requires, each checked against a hand computation."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn

import nnperf
from nnperf.analysis import analyze
from nnperf.hardware import load_gpu
from nnperf.passes.memory import predict_memory
from nnperf.prediction import predict_analysis


@pytest.fixture(scope="module")
def alexnet_caffe():
    return analyze("alexnet-caffe", batch=1, train=False)


def test_worked_example_conv1_on_a_120_tflops_gpu(alexnet_caffe):
    gpu = load_gpu("h100", overrides={"peak_tflops.fp32": "120"})
    conv1 = predict_analysis(alexnet_caffe, gpu).by_module()["conv1"]
    compute_s = 2 * 105_415_200 / 120e12  # background.md: 1.757 microseconds
    assert conv1.compute_s == pytest.approx(compute_s, rel=1e-9)
    assert round(conv1.compute_s * 1e6, 3) == 1.757
    need = conv1.required_bw()
    # fp32 values: 227*227*3 inputs, 55*55*96 outputs, 11*11*3*96 + 96 weights
    assert need["in"] == pytest.approx(154_587 * 4 / compute_s, rel=1e-9)
    assert need["out"] == pytest.approx(290_400 * 4 / compute_s, rel=1e-9)
    assert need["weights"] == pytest.approx(34_944 * 4 / compute_s, rel=1e-9)
    assert round(need["in"] / 1e9) == 352
    assert round(need["out"] / 1e9) == 661
    assert round(need["weights"] / 1e9, -1) == 80


@pytest.mark.parametrize("gpu", ["a100", "h100", "h200"])
def test_mnist_cnn_at_batch_64_is_host_bound(gpu):
    p = predict_analysis(analyze("mnist-cnn", batch=64), load_gpu(gpu))
    assert p.totals["bound"] == "host"
    assert p.step.host_s >= p.step.device_busy_s


def test_large_batch_is_not_host_bound():
    p = predict_analysis(analyze("resnet18", batch=256, amp="bf16"), load_gpu("h100"))
    assert p.totals["bound"] != "host"


def test_no_kernel_beats_the_roofline():
    a = analyze("gpt2", batch=2, seq_len=128, n_layer=2, amp="bf16")
    p = predict_analysis(a, load_gpu("h100"))
    for t in p.step.ops:
        if t.kernels:
            assert t.kernel_s >= max(t.compute_s, t.memory_s) * (1 - 1e-9), t.op


def test_step_time_is_at_least_host_time_and_device_work():
    p = predict_analysis(analyze("resnet18", batch=32), load_gpu("a100"))
    assert p.step.step_s >= p.step.host_s
    assert p.step.step_s >= sum(t.kernel_s for t in p.step.ops) * (1 - 1e-9)
    # module times (kernels plus the idle gaps they waited behind) add up to the step
    # minus whatever the host did after the last kernel
    root = p.by_module(0)[""]
    assert root.time_s <= p.step.step_s * (1 + 1e-9)


def test_throughput_and_mfu_follow_from_step_time():
    a = analyze("gpt2", batch=2, seq_len=64, n_layer=1, amp="bf16")
    p = predict_analysis(a, load_gpu("h100"))
    t = p.totals
    assert t["throughput_unit"] == "tokens/s"
    assert t["throughput"] == pytest.approx(2 * 64 / t["step_time_s"])
    # MFU counts the model's FLOPs (forward and backward), not the optimizer's update
    model_flops = sum(c.flops for c in a.ops if c.phase in ("forward", "backward"))
    assert model_flops < a.totals["flops"]  # AdamW does FLOPs of its own
    assert t["mfu_flops"] == pytest.approx(model_flops)
    assert t["mfu"] == pytest.approx(model_flops / t["step_time_s"] / 989.4e12, rel=1e-3)


def test_json_extends_the_analysis(alexnet_caffe):
    doc = predict_analysis(alexnet_caffe, load_gpu("h100")).to_json()
    assert doc["schema"].startswith("nnperf.prediction/")
    for key in ("step_time_s", "throughput"):
        assert doc["totals"][key] > 0
    conv1 = next(m for m in doc["modules"] if m["name"] == "conv1")
    for key in ("time_s", "compute_s", "memory_s", "bound", "required_bw"):
        assert key in conv1
    assert set(conv1["required_bw"]) == {"in", "out", "weights"}
    assert all("time_s" in op and "bound" in op for op in doc["ops"])


def test_mfu_of_one_linear_layer_by_hand():
    """Linear(64 -> 32, no bias) on 16 rows with SGD: forward 2*16*64*32 FLOPs and the
    weight gradient as many (the input needs no gradient); the loss adds 16*32 FLOPs."""
    a = analyze(nn.Linear(64, 32, bias=False), inputs=torch.randn(16, 64), optimizer="sgd")
    p = predict_analysis(a, load_gpu("h100"))
    gemms = 2 * (2 * 16 * 64 * 32)
    loss = a.totals["flops_forward"] - 2 * 16 * 64 * 32
    assert 0 <= loss <= 2 * 16 * 32  # a sum or mean over the 16x32 output
    assert p.totals["mfu_flops"] == pytest.approx(gemms + loss)
    assert a.totals["flops_optimizer"] > 0  # SGD's update is not in it
    assert p.totals["mfu_peak_flops"] == pytest.approx(67e12)  # fp32 without TF32: CUDA cores
    assert p.totals["mfu"] == pytest.approx((gemms + loss) / p.totals["step_time_s"] / 67e12)


class ReluNet(nn.Module):
    """A root whose own forward calls an op outside any child (as mnist's F.relu)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


def test_the_roots_own_ops_have_a_row():
    a = analyze(ReluNet(), inputs=torch.randn(16, 64))
    rows = {r.name: r for r in a.modules(1)}
    own = rows["(own ops)"]
    assert (own.type, own.depth) == ("ReluNet", 1)
    # relu on the 16x32 output: reads and writes 16*32 fp32 values; 1 FLOP per element in
    # forward (relu) and backward (threshold_backward)
    assert own.tally.bytes_forward == 2 * 16 * 32 * 4
    assert own.tally.flops == 2 * 16 * 32
    depth1 = [r for r in a.modules(1) if r.depth == 1]
    assert sum(r.tally.flops for r in depth1) == pytest.approx(rows[""].tally.flops)


def test_depth_one_rows_add_up_to_the_step():
    p = predict_analysis(analyze("mnist-cnn", batch=2), load_gpu("h100"))
    tallies = p.by_module(1)
    depth1 = [t for name, t in tallies.items() if name]
    assert "(own ops)" in tallies and tallies["(own ops)"].time_s > 0
    assert sum(t.time_s for t in depth1) == pytest.approx(tallies[""].time_s)
    assert sum(t.time_s for t in depth1) == pytest.approx(sum(t.wall_s for t in p.step.ops))


def test_bound_is_the_largest_of_the_columns_that_decide_it():
    """A compute-bound row never shows a larger modeled memory time, and the other way
    round, for single ops and for groups (the tables print these two terms)."""
    p = predict_analysis(analyze("resnet18", batch=64, amp="bf16"), load_gpu("h100"))
    groups = list(p.by_module().items()) + list(p.by_op().items())
    checked = 0
    for name, t in groups:
        if name == "":
            continue
        if t.bound == "compute":
            assert t.model_compute_s >= max(t.model_memory_s, t.overhead_s, t.idle_s), name
        elif t.bound == "memory":
            assert t.model_memory_s >= max(t.model_compute_s, t.overhead_s, t.idle_s), name
        checked += t.bound in ("compute", "memory")
    assert checked > 10
    conv1 = p.by_module()["conv1"]  # forward, data and weight gradient convolutions
    assert conv1.model_compute_s >= conv1.compute_s  # never faster than the peak


def test_the_whole_model_row_carries_the_steps_bound():
    """alexnet at batch 1: the host issues slower than the device runs (the summary says
    host), though the fc layers' kernels are the largest single share."""
    p = predict_analysis(analyze("alexnet-caffe", batch=1, train=False), load_gpu("h100"))
    assert p.step.host_s >= p.step.device_busy_s
    assert p.totals["bound"] == "host"
    assert p.by_module(0)[""].bound == "host"


def test_memory_fit_uses_the_memory_model():
    a = analyze("mlp", batch=8)
    small = load_gpu("h100", overrides={"memory_gib": "0.25"})
    p = predict_analysis(a, small)
    total = predict_memory(a.trace, architecture=small.architecture).device_total
    t = p.totals
    assert t["device_total_bytes"] == total
    # 0.25 GiB resized by --set: no reading of such a card, so the driver's 1.5% is kept back
    assert t["gpu_memory_bytes"] == int(2**28 * (1 - 0.015))
    assert t["fits_in_memory"] is False  # a CUDA context alone is hundreds of MiB
    assert predict_analysis(a, load_gpu("h100")).totals["fits_in_memory"] is True


def test_top_level_functions_have_real_signatures():
    assert "gpu" in inspect.signature(nnperf.predict).parameters
    assert "amp" in inspect.signature(nnperf.analyze).parameters
    assert nnperf.predict.__doc__ and "Predict one step" in nnperf.predict.__doc__
    names = dir(nnperf)
    assert {"analyze", "predict", "__version__"} <= set(names)
    assert "Any" not in names and "annotations" not in names


def _conv_then_linear():
    """fp32: a 3x3 convolution (cuDNN runs it on TF32 by default) and a linear layer (cuBLAS
    keeps fp32 matmuls on CUDA cores by default)."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3, bias=False), nn.Flatten(), nn.Linear(8 * 6 * 6, 10, bias=False))
    return analyze(model, torch.randn(4, 3, 8, 8), train=False)


def test_mfu_divides_by_the_peak_of_the_math_the_kernels_ran():
    gpu = load_gpu("h100")
    p = predict_analysis(_conv_then_linear(), gpu)
    # implicit GEMM of the convolution: M = 4*6*6 outputs, N = 8 channels, K = 3*3*3
    conv = 2 * (4 * 6 * 6) * 8 * (3 * 3 * 3)
    linear = 2 * 4 * 10 * (8 * 6 * 6)
    tf32, fp32 = 494.7e12, 67e12  # H100 SXM5 datasheet: TF32 tensor (dense), fp32 CUDA cores
    peak = (conv + linear) / (conv / tf32 + linear / fp32)
    t = p.totals
    assert t["mfu_math"] == "tf32+fp32"  # most FLOPs first
    assert t["mfu_peak_flops"] == pytest.approx(peak, rel=1e-12)
    assert t["mfu"] == pytest.approx(t["mfu_flops"] / t["step_time_s"] / peak, rel=1e-12)
    assert t["mfu_dtype"] == "fp32"  # the tensors' dtype; the math above is the rate


def test_mfu_with_one_math_mode_is_that_modes_peak():
    from nnperf.passes.timing import TimingOptions

    p = predict_analysis(_conv_then_linear(), load_gpu("h100"), timing=TimingOptions(tf32_matmul=True))
    assert p.totals["mfu_math"] == "tf32"
    assert p.totals["mfu_peak_flops"] == 494.7e12


def test_fp32_resnet50_mfu_is_against_tf32_and_below_one():
    """The bug: convolutions timed at the TF32 rate, MFU divided by the fp32 peak (99.5%
    on H100 at batch 64, with a memory-bound step)."""
    p = predict_analysis(analyze("resnet50", batch=64), load_gpu("h100"))
    t = p.totals
    assert t["mfu_math"].startswith("tf32")
    assert 0 < t["mfu"] < 0.5


def test_cudnn_benchmark_reaches_the_timing_options_and_bad_values_are_refused():
    from nnperf.errors import UsageError

    p = nnperf.predict("mlp", "h100", batch=4, cudnn_benchmark=True)
    assert p.timing.cudnn_benchmark is True and p.to_json()["timing_options"]["cudnn_benchmark"] is True
    assert nnperf.predict("mlp", "h100", batch=4).timing.cudnn_benchmark is False
    for bad in ("yes", "false", 1):
        with pytest.raises(UsageError, match=r"cudnn_benchmark=.* expected True or False"):
            nnperf.predict("mlp", "h100", batch=4, cudnn_benchmark=bad)
