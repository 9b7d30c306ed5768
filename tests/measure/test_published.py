"""The published-measurement set: rows become workloads and step times, and CI holds the
error tables to the committed baseline (they are recomputed from the rows with the current
code, so a model change that makes them worse fails here)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from nnperf.accuracy import REGENERATE, load_table
from nnperf.measure.accuracy_table import is_published, published_runs, stale_rows
from nnperf.measure.published import (
    HF_MISSING,
    MEMORY,
    Predictor,
    gemm_measured_s,
    load_rows,
    measured_step_s,
    pre_sdpa,
    profile_for,
    records,
    tables,
    why_not_reproducible,
    workload,
)
from nnperf.measure.validation import regressions

pytestmark = pytest.mark.accuracy

FOLDER = Path(__file__).resolve().parents[2] / "validation" / "published"
#: The memory rows build hf:bert-large-uncased with transformers (the extras); without it they
#: say so and their table is not compared.
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


@pytest.fixture(scope="module")
def rows():
    return load_rows(FOLDER)


def test_every_row_is_reproducible_or_says_why(rows):
    assert len(rows) > 300
    for row in rows:
        reason = why_not_reproducible(row)
        assert reason is None or reason.strip(), row["id"]
    reproducible = [r for r in rows if why_not_reproducible(r) is None]
    assert {r["task"] for r in reproducible} == {"training", "inference", "gemm"} | (
        {MEMORY} if HAS_TRANSFORMERS else set())
    if not HAS_TRANSFORMERS:
        assert {why_not_reproducible(r) for r in rows if r["task"] == MEMORY} == {HF_MISSING}


def test_rows_become_the_workload_they_describe(rows):
    by_id = {r["id"]: r for r in rows}
    tf32 = workload(by_id["rn50-train-dgxa100-tf32-1gpu"])
    assert (tf32.model, tf32.batch, tf32.train, tf32.tf32, tf32.amp, tf32.optimizer) == (
        "resnet50", 256, True, True, None, "sgd-momentum")
    amp = workload(by_id["rn50-train-dgxa100-amp-1gpu"])
    assert (amp.amp, amp.tf32, amp.dtype) == ("fp16", False, None)
    assert amp.channels_last and not tf32.channels_last  # DLE AMP runs memory_format nhwc
    mobile = workload(by_id["timm-infer-amp-nchw-pt240-cu124-rtx3090-mobilenetv2_100-224"])
    assert (mobile.model, mobile.train, mobile.batch) == ("mobilenet_v2", False, 1024)
    assert not mobile.channels_last
    mobile_nhwc = workload(by_id["timm-infer-amp-nhwc-pt240-cu124-rtx4090-mobilenetv2_100-224"])
    assert (mobile_nhwc.model, mobile_nhwc.batch, mobile_nhwc.channels_last) == ("mobilenet_v2", 512, True)
    b4 = workload(next(r for r in rows if r["model"] == "efficientnet-widese-b4" and r["gpus"] == 1))
    assert (b4.model, b4.image_size) == ("efficientnet_widese_b4", 380)
    trainer = workload(by_id["hf-trainer-bert-large-cls-v100-amp-fp16-bs1-ga4-gc-memory"])
    assert (trainer.model, trainer.task, trainer.attn_implementation, trainer.batch, trainer.seq_len) == (
        "hf:bert-large-uncased", "seq-cls", "eager", 1, 512)
    assert (trainer.train, trainer.amp, trainer.optimizer, trainer.optimizer_impl) == (True, "fp16", "adamw", "single")
    squad = workload(by_id["bert-large-squad-train-a100-80gb-amp-1gpu"])
    assert (squad.model, squad.seq_len, squad.optimizer) == ("bert-large-squad", 384, "adamw")
    phase2 = workload(by_id["bert-large-pretrain-phase2-a100-80gb-amp-1gpu"])
    assert (phase2.model, phase2.seq_len, phase2.batch) == ("bert-large", 512, 32)
    assert why_not_reproducible(next(r for r in rows if r["gpus"] > 1)) is not None


@pytest.mark.parametrize(("container", "before_2_0"), [
    ("PyTorch 1.12, CUDA 11.3 (from the file name)", True),
    ("PyTorch 2.4.0, CUDA 12.4 (from the file name)", False),
    ("NGC pytorch 21.03", True),
    ("NGC pytorch:21.11-py3", True),
    ("NGC pytorch:23.05-py3", False),  # PyTorch 2.0 and later
    ("not stated (driver 460.91.03, CUDA 11.2 per the page's nvidia-smi output)", False),
])
def test_a_pytorch_before_2_0_ran_no_sdpa(container, before_2_0):
    assert pre_sdpa({"container": container}) is before_2_0


def test_rows_of_pytorch_1_x_trace_attention_unfused(rows):
    by_id = {r["id"]: r for r in rows}
    assert workload(by_id["timm-train-amp-nchw-pt112-cu113-rtx3090-vit_base_patch16_224-224"]).sdpa == "unfused"
    assert workload(by_id["timm-infer-amp-nchw-pt240-cu124-rtx3090-vit_base_patch16_224-224"]).sdpa == "fused"


def test_throughput_and_tflops_become_seconds(rows):
    by_id = {r["id"]: r for r in rows}
    assert measured_step_s(by_id["rn50-train-dgxa100-tf32-1gpu"]) == pytest.approx(256 / 938)
    h100 = by_id["mamf-bf16-h100-sxm"]
    assert gemm_measured_s(h100) == pytest.approx(2 * h100["m"] * h100["n"] * h100["k"] / (h100["value"] * 1e12))


@pytest.fixture(scope="module")
def predictor():
    return Predictor()


@pytest.fixture(scope="module")
def recs(rows, predictor):
    return records(rows, predictor)


def test_published_tables_do_not_regress(recs):
    result = tables(recs)
    baseline = json.loads((FOLDER / "baseline.json").read_text())
    if not HAS_TRANSFORMERS:
        baseline = {name: t for name, t in baseline.items() if not name.endswith("device memory")}
    assert regressions(result, baseline) == []


def test_the_committed_track_record_follows_the_current_model_on_published_rows(recs):
    """The accuracy table's published part (``nnperf.accuracy``) from the predictions the
    error tables were just recomputed from (one prediction of ~300 rows, minutes of CPU): a
    model change that moves any fails here until the table is rewritten in the same commit."""
    stale = stale_rows([r for r in load_table() if is_published(r)], published_runs(FOLDER, recs))
    assert stale == [], f"{len(stale)} runs moved; regenerate the table: {REGENERATE}"


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="the memory rows build an hf: model")
def test_memory_rows_hold_at_least_the_model_states(rows, recs):
    """Independent floor: BERT-large-cls's 335,143,938 parameters (24 layers of 12,596,224, the
    embeddings 31,782,912, pooler and classifier 1,051,650) in fp32 with fp32 gradients and two
    Adam moments, plus the stated context, are on the device whatever the activations."""
    params = 24 * 12_596_224 + 31_782_912 + 1_051_650
    assert params == 335_143_938
    predicted = {r["config"]: r["predicted_memory_mib"] for r in recs if r["family"] == MEMORY}
    assert len(predicted) == 5
    for row in (r for r in rows if r["task"] == MEMORY):
        assert predicted[row["id"]] > 16 * params / 2**20 + row["context_mib"], row["id"]


def test_accumulation_averages_backward_only_and_optimizer_iterations(rows, predictor):
    """DLE's 1-GPU ResNet-50 accumulates 8 micro-batches: 7 iterations of forward+backward and
    one with the SGD step, and the published img/s averages them."""
    from nnperf.hardware import load_gpu
    from nnperf.passes.timing import TimingOptions
    from nnperf.prediction import predict_analysis

    row = next(r for r in rows if r["id"] == "rn50-train-dgxa100-tf32-1gpu")
    assert row["grad_accumulation"] == 8
    w, gpu = workload(row), load_gpu("a100-80gb-sxm")
    timing, profile = TimingOptions(tf32_matmul=True), profile_for(row, gpu)
    plain = predict_analysis(predictor._analysis(w, "none"), gpu, profile, timing).step.step_s
    stepped = predict_analysis(predictor._analysis(w, "sgd-momentum"), gpu, profile, timing).step.step_s
    assert stepped > plain
    assert predictor.step_s(row) == pytest.approx((7 * plain + stepped) / 8, rel=1e-12)


def test_dgx_rows_run_on_their_datasheet_cpu(rows):
    from nnperf.hardware import load_gpu
    from nnperf.measure.published import profile_for

    by_id = {r["id"]: r for r in rows}
    a100 = by_id["rn50-train-dgxa100-tf32-1gpu"]  # "A100 80GB (DGX A100)": 2x AMD EPYC 7742
    assert profile_for(a100, load_gpu(a100["gpu_catalog"])).host == "epyc-7742"
    v100 = by_id["rn50-train-dgx1v-fp32-1gpu"]  # "V100 16GB (DGX-1)": 2x Xeon E5-2698 v4
    assert profile_for(v100, load_gpu(v100["gpu_catalog"])).host == "xeon-e5-2698v4"
    timm = by_id["timm-infer-amp-nchw-pt240-cu124-rtx4090-resnet50-224"]  # host not stated
    # host not stated: the default host, a rented GPU's cloud VM (default_profile.toml)
    assert profile_for(timm, load_gpu(timm["gpu_catalog"])).host == "cloud-vm"
