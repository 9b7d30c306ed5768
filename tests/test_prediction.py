"""Figures the prediction issue requires, each checked against a hand computation."""

from __future__ import annotations

import pytest

from nnperf.analysis import analyze
from nnperf.hardware import load_gpu
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
    assert t["mfu"] == pytest.approx(a.totals["flops"] / t["step_time_s"] / 989.4e12, rel=1e-3)


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
