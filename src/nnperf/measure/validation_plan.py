"""Which validation configurations a GPU session runs, in what order, and how long each takes.

A lent GPU gives 30 minutes of device time in commands of at most 10, and results come back
only as files. So the harness runs the most informative configurations first (every model
family once before any second batch size or precision), skips what is predicted not to fit
before paying for it, estimates each configuration's device time before spending it, and
writes one JSON line per finished configuration so a command cut at its limit keeps its work.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nnperf.measure.validation import BATCHES, FULL_OVERRIDES, Config

if TYPE_CHECKING:
    from nnperf.hardware import GPU

#: Models in the order a short session should see them: one of each family and the ones
#: the published-measurement set also has, then the rest, the 7B model last (its build
#: alone takes minutes of a session's time).
MODEL_PRIORITY: tuple[str, ...] = (
    "resnet50", "gpt2", "bert-base", "vit_b_16", "mobilenet_v2", "efficientnet_b0",
    "convnext_tiny", "bert-large", "mlp", "resnet18", "mnist-cnn", "vgg16", "alexnet",
    "efficientnet_b4", "bert-large-squad", "efficientnet_widese_b0", "efficientnet_widese_b4",
    "gpt2-medium", "alexnet-caffe", "gpt2-large", "gpt2-xl", "llama-7b", "mixtral-8x7b",
    "deepseek-v3-16b",
)

#: (train, precision, batch index) in the order they add most: the larger batch first (less
#: host noise, the regime rented GPUs run in), bf16 autocast and training before the rest.
ROUNDS: tuple[tuple[bool, str, int], ...] = (
    (True, "bf16", 1), (False, "bf16", 1), (True, "tf32", 1), (True, "fp32", 1),
    (False, "fp32", 1), (False, "tf32", 1), (True, "bf16", 0), (False, "bf16", 0),
    (True, "fp32", 0), (True, "tf32", 0), (False, "fp32", 0), (False, "tf32", 0),
)

#: CPU-sized versions of every model for a dry run of the whole plan (``--tiny``): the
#: sizes ``validation/cpu_memory.py`` measures in seconds.
TINY: dict[str, tuple[tuple[int, int], int | None, dict[str, int]]] = {
    "mlp": ((16, 64), None, {}),
    "mnist-cnn": ((8, 32), None, {}),
    "alexnet": ((2, 4), None, {"image_size": 96}),
    "alexnet-caffe": ((1, 2), None, {}),
    "vgg16": ((1, 2), None, {"image_size": 32}),
    "resnet18": ((2, 4), None, {"image_size": 64}),
    "resnet50": ((2, 4), None, {"image_size": 64}),
    "mobilenet_v2": ((2, 4), None, {"image_size": 64}),
    "efficientnet_b0": ((2, 4), None, {"image_size": 64}),
    "efficientnet_b4": ((1, 2), None, {"image_size": 64}),
    "efficientnet_widese_b0": ((2, 4), None, {"image_size": 64}),
    "efficientnet_widese_b4": ((1, 2), None, {"image_size": 64}),
    "convnext_tiny": ((2, 4), None, {"image_size": 64}),
    "vit_b_16": ((1, 2), None, {"n_layer": 1, "image_size": 64}),
    "bert-base": ((1, 2), 64, {"n_layer": 1}),
    "bert-large": ((1, 2), 64, {"n_layer": 1}),
    "bert-large-squad": ((1, 2), 64, {"n_layer": 1}),
    "gpt2": ((1, 2), 64, {"n_layer": 1}),
    "gpt2-medium": ((1, 2), 64, {"n_layer": 1}),
    "gpt2-large": ((1, 2), 64, {"n_layer": 1}),
    "gpt2-xl": ((1, 2), 64, {"n_layer": 1}),
    "llama-7b": ((1, 2), 64, {"n_layer": 1, "dim": 512, "n_heads": 8, "ffn_hidden": 1376, "vocab": 4000}),
    "mixtral-8x7b": ((1, 2), 64, {"n_layer": 1, "dim": 512, "n_heads": 8, "n_kv_heads": 4, "ffn_hidden": 704,
                                  "vocab": 4000}),
    "deepseek-v3-16b": ((1, 2), 64, {"n_layer": 2, "dim": 512, "n_heads": 8, "kv_lora": 128, "qk_nope_dim": 32,
                                     "qk_rope_dim": 16, "v_head_dim": 32, "ffn_hidden": 704, "moe_hidden": 128,
                                     "n_experts": 8, "top_k": 2, "vocab": 4000}),
}


def ordered_configs(tiny: bool = False) -> list[Config]:
    """Every configuration, most informative first (``tiny``: the CPU-sized versions)."""
    out = []
    for train, precision, which in ROUNDS:
        for model in MODEL_PRIORITY:
            if tiny:
                batches, seq, overrides = TINY[model]
                out.append(Config(model, train, precision, batches[which], seq,
                                  overrides=tuple(sorted(overrides.items())), tiny=True))
            else:
                out.append(Config(model, train, precision, BATCHES[model][which],
                                  overrides=FULL_OVERRIDES.get(model, ())))
    return out


def _sized(model: str, train: bool, precision: str, tiny: bool, cudnn_benchmark: bool = False) -> Config:
    """``model`` at its larger batch (the size the first run measured), or its CPU-sized
    version (at the smaller tiny batch: a dry run's only job is the code path)."""
    if tiny:
        batches, seq, overrides = TINY[model]
        return Config(model, train, precision, batches[0], seq, tuple(sorted(overrides.items())), tiny=True,
                      cudnn_benchmark=cudnn_benchmark)
    return Config(model, train, precision, BATCHES[model][1], overrides=FULL_OVERRIDES.get(model, ()),
                  cudnn_benchmark=cudnn_benchmark)


#: The CNN steps measured with ``torch.backends.cudnn.benchmark`` off and on (published CNN
#: numbers usually run with it on; the harness never set it): (model, train).
CNN_PAIRS: tuple[tuple[str, bool], ...] = (
    ("resnet50", True), ("resnet50", False), ("efficientnet_b0", True), ("mobilenet_v2", True),
    ("vgg16", True), ("convnext_tiny", True),
)
#: Runs the first H200 run found host-bound (BERT, the MLP, mnist): measured again with more
#: steps, their fastest and median step and back to back. (model, train).
HOST_BOUND: tuple[tuple[str, bool], ...] = (
    ("bert-base", True), ("bert-base", False), ("bert-large", False), ("mlp", True), ("mlp", False),
    ("mnist-cnn", True), ("mnist-cnn", False),
)
#: Runs whose profiler attribution read more device time than the step had (2026-11-28),
#: profiled again with each kernel counted once (``measure.kernel_times``).
REPROFILE: tuple[tuple[str, bool], ...] = (("llama-7b", False), ("mixtral-8x7b", True))


def cnn_pairs(tiny: bool = False) -> list[Config]:
    """Each of ``CNN_PAIRS`` in bf16 and fp16 autocast, cudnn.benchmark off then on."""
    return [_sized(model, train, precision, tiny, benchmark) for model, train in CNN_PAIRS
            for precision in ("bf16", "fp16") for benchmark in (False, True)]


def host_bound(tiny: bool = False) -> list[Config]:
    return [_sized(model, train, "bf16", tiny) for model, train in HOST_BOUND]


def reprofile(tiny: bool = False) -> list[Config]:
    return [_sized(model, train, "bf16", tiny) for model, train in REPROFILE]


#: The configuration lists ``validation/run.py --configs NAME`` runs.
CONFIG_SETS: dict[str, Callable[[bool], list[Config]]] = {
    "zoo": ordered_configs, "cnn-pairs": cnn_pairs, "host-bound": host_bound, "reprofile": reprofile,
}


def shard(configs: Sequence[Config], spec: str | None) -> list[Config]:
    """``"i/n"``: every n-th configuration from the i-th (1-based), so shards stay balanced
    in kind; None: all."""
    if not spec:
        return list(configs)
    try:
        i, n = (int(v) for v in spec.split("/"))
    except ValueError:
        raise ValueError(f"--shard {spec!r}: expected I/N with 1 <= I <= N, e.g. 1/3") from None
    if not 1 <= i <= n:
        raise ValueError(f"--shard {spec!r}: expected I/N with 1 <= I <= N, e.g. 1/3")
    return list(configs[i - 1 :: n])


#: Parameters a GPU initialises per second when the model is built on the device (random
#: init kernels: bandwidth-bound, conservatively 2e9/s); the CPU builds ~6e7/s on one thread
#: (gpu-readiness.md: 50-75M params/s).
INIT_PARAMS_PER_S = {"cuda": 2e9, "cpu": 6e7}
#: Fixed cost per configuration: trace, profiler set-up, allocator reset, RuntimeEstimator
#: (a fake-tensor pass like the trace). Assumption, checked against the first run's times.
FIXED_S = 6.0


@dataclass(frozen=True)
class Estimate:
    """The predicted cost and outcome of one configuration before it runs."""

    config: Config
    params: int
    predicted_step_s: float
    fits: bool
    seconds: float  # device-machine wall time: build + steps + fixed costs
    analysis: Any = field(default=None, repr=False, compare=False)  # the trace, for the run


def estimate(config: Config, gpu: GPU | None, device: str, steps: int, warmup: int,
             back_to_back: bool = False, profile_repeats: int = 3) -> Estimate:
    """Trace the configuration once (the harness traces it anyway) and price its run:
    building the weights, ``warmup + steps`` timed steps (and ``steps`` more back to back),
    the profiled steps (each after a profiled warm-up step), and RuntimeEstimator."""
    from nnperf.analysis import analyze_request
    from nnperf.prediction import predict_analysis

    analysis = analyze_request(config.request(), config.trace_options())
    params = int(analysis.totals["params"])
    step_s, fits = 0.0, True
    if gpu is not None:
        p = predict_analysis(analysis, gpu, timing=config.timing_options())
        step_s, fits = p.step.step_s, p.memory_fit.fits
    kind = "cuda" if device.startswith("cuda") else "cpu"
    timed = warmup + steps * (2 if back_to_back else 1) + 2 * profile_repeats
    seconds = params / INIT_PARAMS_PER_S[kind] + timed * step_s + FIXED_S
    return Estimate(config, params, step_s, fits, seconds, analysis)

