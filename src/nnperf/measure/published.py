"""nnperf against measurements others published (``validation/published/*.toml``).

Until a GPU checks nnperf in every session, published single-GPU figures are the evidence of
its accuracy: NVIDIA DeepLearningExamples' tables, timm's benchmark CSVs, the MAMF matmul
table, the Hugging Face Trainer's memory readings. Each row says its workload (model, batch,
image size, precision, optimizer, gradient accumulation, channels_last, checkpointing) and a
grade (faithful / approximate / out-of-scope); this module builds the same workload, predicts it
on the row's catalog GPU (with the host CPU of the DGX system a row names) and compares step
times (throughput is turned into per-iteration time: ``batch / value`` on one GPU) or, for a
``memory`` row, the device memory nvidia-smi shows (the memory pass's device total). Rows nnperf
cannot build (a model the zoo lacks, more than one GPU, an ``hf:`` model without transformers
installed) are counted as not reproducible with the reason, never dropped. Nothing here is
fitted: the rows are a test set.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nnperf.errors import UsageError
from nnperf.hardware.schema import read_toml

#: A published model name (its first words) -> the zoo model that is the same network. The
#: first match wins, so the SQuAD entry comes before the plain BERT-large one.
_BERT_LARGE = "bert-large-uncased (24 layers, hidden 1024, 16 heads, ffn 4096, vocab 30522)"
ZOO_MODELS = {
    "resnet50": "resnet50",
    "timm resnet50": "resnet50",
    "timm mobilenetv2_100": "mobilenet_v2",
    "timm vit_base_patch16_224": "vit_b_16",
    "timm efficientnet_b0": "efficientnet_b0",  # same network as DLE's B0 (zoo/efficientnet.py)
    "timm convnext_tiny": "convnext_tiny",
    "efficientnet-b0": "efficientnet_b0",
    "efficientnet-b4": "efficientnet_b4",
    "efficientnet-widese-b0": "efficientnet_widese_b0",
    "efficientnet-widese-b4": "efficientnet_widese_b4",
    _BERT_LARGE + ", squad v1.1 qa head": "bert-large-squad",
    _BERT_LARGE: "bert-large",
}
#: Published optimizers (a word of the row's ``optimizer``) -> nnperf's. DLE ResNet-50 and
#: timm's benchmark default use SGD with momentum; DLE BERT's ``BertAdam`` and apex
#: ``FusedAdam`` (``adam_w_mode`` by default) are Adam with decoupled weight decay. LAMB
#: (BERT pre-training) and RMSprop (EfficientNet) have no nnperf equivalent and keep the
#: SGD-momentum default; those rows accumulate 16 to 512 micro-batches per optimizer step.
OPTIMIZERS = {"sgd": "sgd-momentum", "bertadam": "adamw", "fusedadam": "adamw"}


@dataclass(frozen=True)
class Workload:
    """What nnperf traces for a row: the zoo model and the step's settings."""

    model: str
    batch: int
    image_size: int | None
    train: bool
    amp: str | None
    dtype: str | None
    tf32: bool
    optimizer: str
    channels_last: bool = False
    seq_len: int | None = None
    optimizer_impl: str = "foreach"
    #: An ``hf:`` model's task head and attention implementation.
    task: str | None = None
    attn_implementation: str | None = None
    #: How ``F.scaled_dot_product_attention`` runs (``TraceOptions.sdpa``): "unfused" where the
    #: row's PyTorch predates it (``pre_sdpa``), as the model code of the time did attention
    #: (a model that calls no SDPA, which "unfused" is refused for, is traced as it is).
    sdpa: str = "fused"


@dataclass(frozen=True)
class PredictedStep:
    """A row's predicted seconds per iteration and what bounds it (``StepTime.bound``)."""

    step_s: float
    bound: str


#: What a ``memory`` row's value is: nvidia-smi's used memory, MiB.
MEMORY = "memory"
HF_MISSING = "needs transformers (pip install 'nnperf[hf]')"


def load_rows(folder: str | Path) -> list[dict[str, Any]]:
    """Every ``[[measurement]]`` of every TOML file in ``folder``, with its file's name."""
    rows = []
    for path in sorted(Path(folder).glob("*.toml")):
        doc = read_toml(path, "published-measurement file")
        for row in doc.get("measurement", []):
            rows.append({**row, "file": path.name})
    return rows


def zoo_model(row: dict[str, Any]) -> str | None:
    """The model nnperf builds for the row: a zoo name, or the row's own ``hf:`` id."""
    if str(row.get("model", "")).startswith("hf:"):
        return str(row["model"])
    name = str(row.get("model", "")).lower()
    for published, zoo in ZOO_MODELS.items():
        if name == published or name.startswith(published + " "):
            return zoo
    return None


def why_not_reproducible(row: dict[str, Any]) -> str | None:
    """None when nnperf can build the row's workload, else the reason."""
    if row.get("grade") == "out-of-scope":
        return "out of scope (" + str(row.get("grade_reason", "more than one GPU"))[:60] + ")"
    if int(row.get("gpus", 1)) != 1:
        return "more than one GPU"
    if not row.get("gpu_catalog"):
        return "GPU not in the catalog"
    if row["task"] == "gemm":
        return None if row.get("nnperf_precision") else "precision nnperf does not model"
    if zoo_model(row) is None:
        return f"no zoo model for {str(row.get('model')).split(' (')[0]!r}"
    if str(row["model"]).startswith("hf:") and importlib.util.find_spec("transformers") is None:
        return HF_MISSING
    if not row.get("nnperf_precision"):
        return "precision nnperf does not model"
    return None


def pre_sdpa(row: dict[str, Any]) -> bool:
    """Whether the row ran a PyTorch without ``F.scaled_dot_product_attention``, which first
    shipped in PyTorch 2.0 (released 2023-03-15). Read from ``container``: "PyTorch 1.12, CUDA
    11.3" names the version; an NGC tag "21.03" is the container's year and month, and NGC
    containers before 23.03 hold PyTorch 1.x (their release notes). Models of that time (timm
    0.6's ViT, DLE's BERT) computed attention as GEMM, softmax, dropout, GEMM: what nnperf's
    ``--sdpa unfused`` traces in place of the fused kernel."""
    container = str(row.get("container", ""))
    named = re.search(r"PyTorch (\d+)\.(\d+)", container)
    if named:
        return int(named.group(1)) < 2
    ngc = re.search(r"NGC pytorch:? ?(\d\d)\.(\d\d)", container)
    return bool(ngc) and (int(ngc.group(1)), int(ngc.group(2))) < (23, 3)


def workload(row: dict[str, Any]) -> Workload:
    """The step a reproducible row describes. ``tf32``: fp32 tensors with TF32 matmuls (and
    convolutions, cuDNN's default); ``fp32`` on V100/T4 has no TF32 to use."""
    precision = row["nnperf_precision"]
    words = re.findall(r"[a-z]+", str(row.get("optimizer") or "sgd").lower())
    optimizer = row.get("nnperf_optimizer") or next((OPTIMIZERS[w] for w in words if w in OPTIMIZERS),
                                                    "sgd-momentum")
    return Workload(
        model=zoo_model(row) or "",
        batch=int(row["batch"]),
        image_size=row.get("image_size"),
        train=row["task"] in ("training", MEMORY),
        amp=precision.removeprefix("amp-") if precision.startswith("amp-") else None,
        dtype=precision if precision in ("fp16", "bf16") else None,
        tf32=precision == "tf32",
        optimizer=optimizer,
        channels_last="channels_last" in row.get("extras", ()),
        seq_len=row.get("seq_len"),
        optimizer_impl=row.get("optimizer_impl", "foreach"),
        task=row.get("hf_task"),
        attn_implementation=row.get("attn_implementation"),
        sdpa="unfused" if pre_sdpa(row) else "fused",
    )


def profile_for(row: dict[str, Any], gpu: Any) -> Any:
    """The default profile, with the host CPU of the system the row names ("A100 80GB (DGX
    A100)": its datasheet CPU, ``hardware/hosts.toml``); rows naming no system keep the default host."""
    from nnperf.hardware import default_profile
    from nnperf.hardware.host import list_hosts, with_host

    profile = default_profile(gpu)
    text = str(row.get("gpu", ""))
    for host in list_hosts().values():
        if any(f"({system})" in text for system in host.systems):
            return with_host(profile, host)
    return profile


def measured_step_s(row: dict[str, Any]) -> float:
    """Seconds per iteration of one GPU from the published throughput (samples/s)."""
    return int(row["batch"]) / float(row["value"])


class Predictor:
    """Predicts rows, tracing each distinct workload once (the GPU only changes timing)."""

    def __init__(self) -> None:
        self._analyses: dict[tuple, Any] = {}
        self._no_sdpa: set[str] = set()  # models whose step calls no SDPA: traced as they are

    def _analysis(self, w: Workload, optimizer: str) -> Any:
        from nnperf.analysis import analyze
        from nnperf.trace.attention import NO_SDPA_CALLED

        key = (w, optimizer)
        if key not in self._analyses:
            # the row's image size always: EfficientNet-B4's default is 380, not 224
            options = {"image_size": w.image_size} if w.image_size else {}

            def traced(sdpa: str) -> Any:
                return analyze(w.model, batch=w.batch, seq_len=w.seq_len, train=w.train, amp=w.amp,
                               dtype=w.dtype, optimizer=optimizer, channels_last=w.channels_last,
                               sdpa=sdpa, **options)

            sdpa = "fused" if w.model in self._no_sdpa else w.sdpa
            try:
                self._analyses[key] = traced(sdpa)
            except UsageError as err:
                # a pre-2.0 row of a CNN, or of DLE's BERT (attention as bmm): nothing to unfuse
                if sdpa != "unfused" or str(err) != NO_SDPA_CALLED:
                    raise
                self._no_sdpa.add(w.model)
                self._analyses[key] = traced("fused")
        return self._analyses[key]

    def step_s(self, row: dict[str, Any]) -> float:
        """Predicted seconds per iteration (``step``)."""
        if row["task"] == "gemm":
            from nnperf.hardware import load_gpu

            return self._gemm_s(row, load_gpu(row["gpu_catalog"]))
        return self.step(row).step_s

    def step(self, row: dict[str, Any]) -> PredictedStep:
        """A training or inference row's predicted iteration. With gradient accumulation k the
        optimizer runs on one iteration in k: the published average is ((k-1) *
        forward+backward + full) / k, and its bound that of the iterations holding most of it."""
        from nnperf.hardware import load_gpu
        from nnperf.passes.timing import TimingOptions
        from nnperf.prediction import predict_analysis

        gpu = load_gpu(row["gpu_catalog"])
        profile = profile_for(row, gpu)
        w = workload(row)
        timing = TimingOptions(tf32_matmul=w.tf32)  # convolutions: cuDNN's default, TF32 where it exists

        def step_with(optimizer: str) -> PredictedStep:
            step = predict_analysis(self._analysis(w, optimizer), gpu, profile=profile, timing=timing).step
            return PredictedStep(step.step_s, str(step.bound))

        full = step_with(w.optimizer if w.train else "none")
        k = int(row.get("grad_accumulation") or 1)
        if not w.train or k == 1:
            return full
        backward_only = step_with("none")
        bound = backward_only.bound if (k - 1) * backward_only.step_s >= full.step_s else full.bound
        return PredictedStep(((k - 1) * backward_only.step_s + full.step_s) / k, bound)

    @staticmethod
    def memory_mib(row: dict[str, Any]) -> float:
        """The device memory of a ``memory`` row's training loop (``nnperf memory``): the
        traced step with the row's accumulation, checkpointing and ``zero_grad`` setting,
        replayed through the allocator, plus the CUDA context the row states (or the one of its
        CUDA version)."""
        from nnperf.hardware import load_gpu
        from nnperf.passes.memory import predict_memory
        from nnperf.request import ModelRequest
        from nnperf.search.memory_variants import MemoryOptions, trace_memory
        from nnperf.trace.options import TraceOptions

        gpu = load_gpu(row["gpu_catalog"])
        w = workload(row)
        request = ModelRequest(w.model, batch=w.batch, seq_len=w.seq_len, task=w.task,
                               attn_implementation=w.attn_implementation)
        step = TraceOptions(optimizer=w.optimizer, optimizer_impl=w.optimizer_impl, amp=w.amp, dtype=w.dtype)
        options = MemoryOptions(step, grad_accum=int(row.get("grad_accumulation") or 1),
                                set_to_none=bool(row.get("set_to_none", True)),
                                checkpoint=bool(row.get("gradient_checkpointing", False)))
        name, trace, _ = trace_memory(request, options)
        context = row.get("context_mib") or gpu.arch.context_mib_at(row.get("cuda_version"))
        report = predict_memory(trace, model=name, architecture=gpu.architecture, context_mib=context)
        return (report.device_total or 0) / 2**20

    @staticmethod
    def _gemm_s(row: dict[str, Any], gpu: Any) -> float:
        """A matmul row's value is TFLOP/s at its shape: compare times of that one GEMM."""
        from nnperf.hardware import default_profile
        from nnperf.kernels.gemm import estimate_gemm

        m, n, k = int(row["m"]), int(row["n"]), int(row["k"])
        return estimate_gemm(m, n, k, dtype=row["nnperf_precision"], gpu=gpu, profile=default_profile(gpu)).time_s


def gemm_measured_s(row: dict[str, Any]) -> float:
    return 2.0 * int(row["m"]) * int(row["n"]) * int(row["k"]) / (float(row["value"]) * 1e12)


def records(rows: Iterable[dict[str, Any]], predictor: Predictor | None = None) -> list[dict[str, Any]]:
    """One record per row in the shape ``measure.validation.error_table`` reads: ``family`` is
    the task (training / inference / gemm), ``config`` the row id; rows nnperf cannot build
    carry ``not_reproducible`` and no prediction; a step-time row also its ``predicted_bound``."""
    predictor = predictor or Predictor()
    out = []
    for row in rows:
        reason = why_not_reproducible(row)
        rec: dict[str, Any] = {"config": row["id"], "family": row["task"], "grade": row.get("grade"),
                               "gpu": row.get("gpu_catalog"), "file": row["file"]}
        if reason:
            out.append({**rec, "not_reproducible": reason})
            continue
        if row["task"] == MEMORY:
            out.append({**rec, "measured_memory_mib": float(row["value"]),
                        "predicted_memory_mib": predictor.memory_mib(row)})
            continue
        if row["task"] == "gemm":
            out.append({**rec, "measured_step_time_s": gemm_measured_s(row),
                        "predicted_step_time_s": predictor.step_s(row)})
            continue
        step = predictor.step(row)
        out.append({**rec, "measured_step_time_s": measured_step_s(row), "predicted_step_time_s": step.step_s,
                    "predicted_bound": step.bound})
    return out


def tables(recs: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Error tables per grade (faithful, approximate): step time grouped by task and overall,
    and device memory (the ``memory`` rows) in a table of its own."""
    from nnperf.measure.validation import error_table

    out = {}
    for grade in ("faithful", "approximate"):
        chosen = [r for r in recs if r.get("grade") == grade and "not_reproducible" not in r]
        times = [r for r in chosen if r["family"] != MEMORY]
        memory = [r for r in chosen if r["family"] == MEMORY]
        if times:
            out[f"published, {grade}: step time"] = error_table(times)
        if memory:
            out[f"published, {grade}: device memory"] = error_table(
                memory, key="predicted_memory_mib", measured_key="measured_memory_mib")
    return out
