"""The validation harness's library side: configurations, records and the error table.

``validation/run.py`` measures configurations on a real device and writes one JSON record per
run; ``validation/compare.py`` recomputes nnperf's predictions for the same configurations and
prints the error table. ``error_table`` is importable so a CI test can recompute the table
from committed records without a GPU.

Error convention: absolute percentage error, |predicted - measured| / measured * 100. The
percentiles are linear-interpolated (``stats.percentile``, numpy's default method).
"""

from __future__ import annotations

import fnmatch
import itertools
import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nnperf.measure.stats import percentile

if TYPE_CHECKING:  # imported where used: the error table needs no torch
    from nnperf.hardware import DeviceProfile
    from nnperf.passes.timing import TimingOptions
    from nnperf.request import ModelRequest
    from nnperf.trace.options import TraceOptions

RECORD_SCHEMA = "nnperf.validation.record/1"


@dataclass(frozen=True)
class Config:
    """One validation run: a model (built-in, or a library model: ``hf:``, ``timm:``,
    ``tv:``), a mode, a precision, a batch size, a memory format and whether cuDNN picks its
    convolution algorithms by timing them (``torch.backends.cudnn.benchmark``)."""

    model: str
    train: bool
    precision: str  # "fp32" | "tf32" | "bf16" | "fp16" (the last two: autocast)
    batch: int
    seq: int | None = None
    overrides: tuple[tuple[str, int], ...] = ()  # the model's -O settings
    tiny: bool = False  # a CPU-sized version (dry runs of the GPU plan)
    channels_last: bool = False  # weights and 4-D inputs in torch.channels_last
    cudnn_benchmark: bool = False  # torch.backends.cudnn.benchmark for the run

    @property
    def name(self) -> str:
        mode = "train" if self.train else "infer"
        seq = f"-s{self.seq}" if self.seq else ""
        layout = "-cl" if self.channels_last else ""
        benchmark = "-cbm" if self.cudnn_benchmark else ""
        return (f"{self.model}-{mode}-{self.precision}-b{self.batch}{seq}{layout}{benchmark}"
                f"{'-tiny' if self.tiny else ''}")

    def request(self) -> ModelRequest:
        """The workload this configuration builds: the zoo model at its batch and sequence."""
        from nnperf.request import ModelRequest

        return ModelRequest(self.model, batch=self.batch, seq_len=self.seq, overrides=dict(self.overrides))

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "train": self.train, "precision": self.precision,
                "batch": self.batch, "seq": self.seq, "overrides": dict(self.overrides),
                "tiny": self.tiny, "channels_last": self.channels_last,
                "cudnn_benchmark": self.cudnn_benchmark}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Config:
        """The configuration a record was measured with (records written before a switch
        existed ran with its default)."""
        return cls(record["model"], record["train"], record["precision"], record["batch"],
                   record.get("seq"), tuple(sorted((record.get("overrides") or {}).items())),
                   bool(record.get("tiny")), bool(record.get("channels_last")),
                   record_flag(record, "cudnn_benchmark"))

    def trace_options(self) -> TraceOptions:
        """How its step runs: training or inference, with autocast for "bf16" and "fp16" (fp16
        training with PyTorch's GradScaler, as a real loop runs it), in ``channels_last``."""
        from nnperf.trace.options import TraceOptions

        amp = self.precision if self.precision in ("bf16", "fp16") else None
        return TraceOptions(train=self.train, amp=amp, channels_last=self.channels_last)

    @property
    def tf32(self) -> bool:
        return self.precision == "tf32"

    def timing_options(self) -> TimingOptions:
        """The library settings its predicted step runs with, as its measured step does."""
        from nnperf.passes.timing import TimingOptions

        return TimingOptions(tf32_matmul=self.tf32, cudnn_benchmark=self.cudnn_benchmark)


def record_flag(record: dict[str, Any], key: str) -> bool:
    """A record's on/off setting: absent is off; anything but true or false is refused with
    the record's name, the key and what is valid (a hand-edited "yes" would read as on)."""
    value = record.get(key, False)
    if not isinstance(value, bool):
        raise ValueError(f"record {record.get('config', '?')!r}: {key} is {value!r}; expected true or false")
    return value


#: Two batch sizes per zoo model, sized for one 80 GB-class GPU (training the large decoders
#: at these sizes may not fit smaller GPUs: the harness records "does not fit" and goes on).
BATCHES: dict[str, tuple[int, ...]] = {
    "mlp": (64, 1024),
    "mnist-cnn": (64, 512),
    "alexnet": (64, 128),
    "alexnet-caffe": (64, 128),
    "vgg16": (16, 64),
    "resnet18": (32, 128),
    "resnet50": (32, 64),
    "mobilenet_v2": (32, 128),
    "efficientnet_b0": (32, 128),
    "efficientnet_b4": (8, 32),  # 380x380
    "efficientnet_widese_b0": (32, 128),
    "efficientnet_widese_b4": (8, 32),
    "convnext_tiny": (32, 128),
    "vit_b_16": (16, 64),
    "bert-base": (8, 32),
    "bert-large": (4, 16),
    "bert-large-squad": (2, 8),  # 384 tokens
    "gpt2": (4, 8),
    "gpt2-medium": (2, 8),
    "gpt2-large": (1, 4),
    "gpt2-xl": (1, 2),
    "llama-7b": (1, 2),
    "mixtral-8x7b": (1, 2),
    "deepseek-v3-16b": (1, 2),
}
#: -O settings of the full-size configurations: Mixtral's 46.7B parameters fit no one GPU, so
#: 2 of its 32 blocks (2.9B parameters; fp32 AdamW training needs ~47 GB); DeepSeek-V3 16B's
#: dense block and 2 MoE blocks (1.7B parameters, ~27 GB of fp32 AdamW state).
FULL_OVERRIDES: dict[str, tuple[tuple[str, int], ...]] = {"mixtral-8x7b": (("n_layer", 2),),
                                                         "deepseek-v3-16b": (("n_layer", 3),)}
PRECISIONS = ("fp32", "tf32", "bf16")


def default_configs() -> list[Config]:
    """Every zoo model x {train, inference} x {fp32, tf32, bf16} x two batch sizes."""
    return [
        Config(model, train, precision, batch, overrides=FULL_OVERRIDES.get(model, ()))
        for model, batches in BATCHES.items()
        for train, precision, batch in itertools.product((True, False), PRECISIONS, batches)
    ]


def matches(config: Config, pattern: str) -> bool:
    """``pattern`` selects ``config``: the model's exact name (``gpt2`` is not
    ``gpt2-medium``), a glob over configuration names (``*-train-bf16-*``), or a name prefix
    that spells the whole model (``mlp-infer-bf16``)."""
    if pattern == config.model or fnmatch.fnmatchcase(config.name, pattern):
        return True
    return config.name.startswith(pattern + "-") and (pattern + "-").startswith(config.model + "-")


def select(configs: Iterable[Config], only: Sequence[str] = ()) -> list[Config]:
    """The configurations any of ``only`` selects (all when empty), order kept."""
    return [c for c in configs if not only or any(matches(c, p) for p in only)]


def family_of(model: str) -> str:
    try:
        from nnperf.zoo import get_model

        return get_model(model).family
    except Exception:
        return "other"


def load_records(path: str | Path) -> list[dict[str, Any]]:
    """Every record in ``path``: a JSON-lines file the harness appends to, or a folder of
    them (and of one-record ``.json`` files, the harness's earlier format). A torn last line
    (a command killed mid-write) is skipped: every line before it is a whole record."""
    path = Path(path)
    files = [path] if path.is_file() else sorted([*path.glob("**/*.jsonl"), *path.glob("**/*.json")])
    out = []
    for file in files:
        lines = file.read_text().splitlines() if file.suffix == ".jsonl" else [file.read_text()]
        for line in lines:
            try:
                doc = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(doc, dict) and doc.get("schema") == RECORD_SCHEMA:
                doc["_file"] = str(file)
                out.append(doc)
    return out


def absolute_percentage_error(predicted: float, measured: float) -> float:
    return abs(predicted - measured) / measured * 100.0


def error_table(
    records: Iterable[dict[str, Any]],
    key: str = "predicted_step_time_s",
    measured_key: str = "measured_step_time_s",
) -> dict[str, dict[str, Any]]:
    """Median, 90th percentile and worst absolute percentage error of ``key`` against
    ``measured_key``, per model family and ``"overall"``: step times by default, peak memory
    with ``key="predicted_peak_memory_bytes", measured_key="measured_peak_memory_bytes"``.

    A record needs ``measured_key`` (a number, or a dict with ``median``), ``key`` and
    ``family`` (or ``model``, whose zoo family is looked up). Records lacking either value
    (e.g. "does not fit") are counted as ``skipped``.
    """
    errors: dict[str, list[tuple[float, str]]] = defaultdict(list)
    skipped: dict[str, int] = defaultdict(int)
    for r in records:
        family = r.get("family") or family_of(r.get("model", ""))
        measured = r.get(measured_key)
        if isinstance(measured, dict):
            measured = measured.get("median")
        predicted = r.get(key)
        if not measured or predicted is None:
            skipped[family] += 1
            skipped["overall"] += 1
            continue
        err = absolute_percentage_error(predicted, measured)
        label = r.get("config") or r.get("model", "?")
        errors[family].append((err, str(label)))
        errors["overall"].append((err, str(label)))
    table = {}
    for group in sorted(set(errors) | set(skipped), key=lambda g: (g == "overall", g)):
        values = [e for e, _ in errors.get(group, [])]
        worst = max(errors[group]) if values else None
        table[group] = {
            "n": len(values),
            "skipped": skipped.get(group, 0),
            "median_ape": percentile(values, 50) if values else None,
            "p90_ape": percentile(values, 90) if values else None,
            "worst_ape": worst[0] if worst else None,
            "worst_config": worst[1] if worst else None,
        }
    return table


def runtime_estimator_s(config: Config, device: str = "cuda") -> float | None:
    """PyTorch's own operator-level cost model (``RuntimeEstimator``, roofline mode) for the
    same step, in seconds; None where it cannot run (it needs a CUDA device: it reads the
    device's peak FLOP/s and bandwidth, and runs under FakeTensorMode on cuda tensors)."""
    import torch

    if not torch.cuda.is_available():
        return None
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.runtime_estimator import RuntimeEstimator

    from nnperf.loading import resolve
    from nnperf.measure.step import build_step

    _, build = resolve(config.request())
    options = config.trace_options()
    estimator = RuntimeEstimator()
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = config.tf32
    try:
        with FakeTensorMode():
            step = build_step(build, options, torch.device(device))
            step.run()  # one step outside the estimate creates the optimizer state
            with estimator("operator-level-cost-model"):
                step.run()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    return estimator.total_runtime / 1e3  # total_runtime is in milliseconds


def repredict(record: dict[str, Any], gpu_name: str | None, profile: DeviceProfile | None = None) -> None:
    """Predict the record's configuration again with the current code: the step time on
    ``gpu_name`` (when given) from its datasheet entry, and from ``profile`` (a calibration of
    that GPU: ``predicted_step_time_calibrated_s``) when given, and the peak memory of what
    the record measured, so a table of committed measurements follows the model as it changes.
    ``predicted_bound``: what bounds the datasheet prediction's step."""
    from nnperf.analysis import analyze_request
    from nnperf.hardware import load_gpu
    from nnperf.measure.runner import predicted_peak_memory
    from nnperf.prediction import predict_analysis

    config = Config.from_record(record)
    analysis = analyze_request(config.request(), config.trace_options())
    record["predicted_peak_memory_bytes"] = predicted_peak_memory(analysis, record.get("device", "cuda"))
    record["predicted_step_time_s"] = None
    if gpu_name:
        gpu, timing = load_gpu(gpu_name), config.timing_options()
        step = predict_analysis(analysis, gpu, timing=timing).step
        record["predicted_step_time_s"], record["predicted_bound"] = step.step_s, str(step.bound)
        if profile is not None:
            record["predicted_step_time_calibrated_s"] = predict_analysis(analysis, gpu, profile, timing).step.step_s


def calibrated_profile(path: str | Path, gpu_name: str | None, given: str | Path | None = None) -> DeviceProfile | None:
    """``given``, else the calibration committed beside the records (``profile.toml`` in the
    records' folder), for ``gpu_name``; None without either."""
    from nnperf.hardware import load_gpu
    from nnperf.hardware.profile import load_profile

    path = Path(path)
    beside = (path if path.is_dir() else path.parent) / "profile.toml"
    chosen = given or (beside if beside.exists() else None)
    if chosen is None or gpu_name is None:
        return None
    return load_profile(chosen, load_gpu(gpu_name))


#: How far (percentage points) a committed error table's median or p90 may grow before CI
#: calls it a regression: re-tracing is deterministic, so any growth is a model change.
REGRESSION_POINTS = 0.5


def regressions(
    tables: dict[str, dict[str, dict[str, Any]]],
    baseline: dict[str, dict[str, dict[str, Any]]],
    points: float = REGRESSION_POINTS,
) -> list[str]:
    """Where ``tables`` is worse than ``baseline`` (both: table name -> group -> row): a
    median or p90 more than ``points`` higher, or fewer records compared."""
    worse = []
    for name, table in baseline.items():
        for group, old in table.items():
            new = tables.get(name, {}).get(group)
            if new is None or new["n"] < old["n"]:
                worse.append(f"{name} / {group}: {old['n']} records compared before, "
                             f"{0 if new is None else new['n']} now")
                continue
            for stat in ("median_ape", "p90_ape"):
                if old[stat] is not None and new[stat] is not None and new[stat] > old[stat] + points:
                    worse.append(f"{name} / {group}: {stat} {old[stat]:.2f}% -> {new[stat]:.2f}%")
    return worse


def error_tables(records: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """The tables ``validation/compare.py`` prints: nnperf's step time, RuntimeEstimator's
    where recorded, and nnperf's peak memory."""
    tables = {"nnperf: step time": error_table(records)}
    if any(r.get("predicted_step_time_calibrated_s") for r in records):
        tables["nnperf, calibrated profile: step time"] = error_table(records, key="predicted_step_time_calibrated_s")
    if any(r.get("runtime_estimator_step_time_s") for r in records):
        tables["torch RuntimeEstimator: step time"] = error_table(records, key="runtime_estimator_step_time_s")
    tables["nnperf: peak memory"] = error_table(
        records, key="predicted_peak_memory_bytes", measured_key="measured_peak_memory_bytes")
    return tables
