"""Fresh configurations: runs the model has never been compared with, frozen before it changes.

Every configuration measured so far (``validation/data/h200-sxm/``) is something the model can
now be tuned to. These ~20 are not: models by library name, fp16 and channels_last, batches
larger and smaller than the zoo's, inference at batch 1. Their file holds the date, the commit
of the model that predicted them and its predictions, written *before* any change the
measurements could inform; their first comparison is against those frozen numbers.

    python validation/fresh.py freeze -o validation/fresh/frozen-2026-12-02.json   # once, here
    python validation/fresh.py list validation/fresh/frozen-2026-12-02.json       # the names
    python validation/run.py --fresh validation/fresh/frozen-2026-12-02.json ...  # measure them

Library models (``hf:``, ``timm:``, ``tv:``) need their extras installed (the device machine's
image has transformers, timm and torchvision).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from nnperf.measure.validation import Config

SCHEMA = "nnperf.validation.fresh/1"

#: The frozen set (2026-12-02). Chosen to leave the committed H200 set: other architectures by
#: library name (Qwen2/Llama-3.2/Mistral-style decoders, RoBERTa, DistilBERT, timm's ViT and
#: RegNet, torchvision's ResNet-101, DenseNet, MobileNetV3, Swin), fp16 autocast with its
#: GradScaler, channels_last, batch 1 inference, and batches outside BATCHES.
FRESH: tuple[Config, ...] = (
    Config("hf:Qwen/Qwen2.5-0.5B", True, "bf16", 8, 512),
    Config("hf:Qwen/Qwen2.5-0.5B", False, "bf16", 1, 512),
    Config("hf:meta-llama/Llama-3.2-1B", True, "bf16", 4, 1024),
    Config("hf:meta-llama/Llama-3.2-1B", False, "bf16", 1, 128),
    Config("hf:mistralai/Mistral-7B-v0.1", False, "bf16", 1, 2048),
    Config("hf:roberta-base", True, "fp16", 32, 128),
    Config("hf:distilbert-base-uncased", False, "fp16", 64, 128),
    Config("timm:vit_small_patch16_224", True, "bf16", 128),
    Config("timm:regnety_016", True, "bf16", 128),
    Config("tv:resnet101", True, "fp16", 64, channels_last=True),
    Config("tv:densenet121", True, "bf16", 64),
    Config("tv:mobilenet_v3_large", False, "bf16", 1),
    Config("tv:swin_t", True, "bf16", 64),
    Config("resnet50", True, "fp16", 128),
    Config("resnet50", True, "bf16", 64, channels_last=True),
    Config("resnet50", False, "fp16", 256, channels_last=True),
    Config("gpt2", True, "fp16", 16),
    Config("bert-base", False, "bf16", 1),
    Config("vgg16", True, "fp16", 32, channels_last=True),
    Config("efficientnet_b0", True, "bf16", 64, channels_last=True),
    Config("llama-7b", True, "bf16", 1, 2048, overrides=(("n_layer", 8),)),
    Config("gpt2-medium", False, "bf16", 1),
)

#: Library decoders keep their layout (grouped-query heads, tied embeddings) at a CPU's size:
#: one layer, width 256 in heads of 64, a 1024-token vocabulary (their full vocabularies alone
#: are 16-262M parameters, minutes of AdamW on two cores).
_SMALL_DECODER = (("num_hidden_layers", 1), ("hidden_size", 256), ("intermediate_size", 512),
                  ("num_attention_heads", 4), ("num_key_value_heads", 2), ("vocab_size", 1024))

#: CPU-sized stand-ins for a dry run of the same code paths (``--tiny``): each fresh
#: configuration at batch 1-2 on a small input, library models cut to one or two layers and
#: token models to width 128-256 (fp16 matmuls have no fast CPU kernel: a full-width GPT-2
#: block's training step took 16 s on two cores).
TINY_OVERRIDES: dict[str, tuple[tuple[str, Any], ...]] = {
    "hf:Qwen/Qwen2.5-0.5B": _SMALL_DECODER,
    "hf:meta-llama/Llama-3.2-1B": (*_SMALL_DECODER, ("head_dim", 64)),
    "hf:mistralai/Mistral-7B-v0.1": _SMALL_DECODER,
    "hf:roberta-base": (("num_hidden_layers", 1), ("hidden_size", 256), ("intermediate_size", 512),
                        ("num_attention_heads", 4), ("vocab_size", 1024)),
    "hf:distilbert-base-uncased": (("n_layers", 1), ("dim", 256), ("hidden_dim", 512), ("n_heads", 4),
                                   ("vocab_size", 1024)),
    "timm:vit_small_patch16_224": (("depth", 1),),
    "llama-7b": (("n_layer", 1), ("dim", 512), ("n_heads", 8), ("ffn_hidden", 1376), ("vocab", 4000)),
    "gpt2": (("n_layer", 1), ("n_embd", 128), ("n_head", 2), ("vocab", 4000)),
    "gpt2-medium": (("n_layer", 1), ("n_embd", 128), ("n_head", 2), ("vocab", 4000)),
    "bert-base": (("n_layer", 1), ("n_embd", 128), ("n_head", 2), ("intermediate", 512), ("vocab", 4000)),
    "resnet50": (("image_size", 64),),
    "vgg16": (("image_size", 32),),
    "efficientnet_b0": (("image_size", 64),),
}


#: Token models whose fresh configurations run at the zoo's default length (512-1024 tokens).
TOKEN_MODELS = frozenset({"gpt2", "gpt2-medium", "bert-base"})


def tiny(config: Config) -> Config:
    """The configuration's CPU-sized stand-in: batch at most 2, sequences of 64, fewer layers."""
    seq = 64 if config.seq or config.model in TOKEN_MODELS else None
    return Config(config.model, config.train, config.precision, min(config.batch, 2),
                  seq, TINY_OVERRIDES.get(config.model, ()), tiny=True,
                  channels_last=config.channels_last, cudnn_benchmark=config.cudnn_benchmark)


def load(path: str | Path, tiny_configs: bool = False) -> list[Config]:
    """The configurations a frozen file lists (their CPU-sized stand-ins with ``tiny_configs``)."""
    doc = json.loads(Path(path).read_text())
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a frozen configuration file (schema {SCHEMA})")
    configs = [Config.from_record(row) for row in doc["configs"]]
    return [tiny(c) for c in configs] if tiny_configs else configs


def _commit() -> str:
    out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    # the harness's own record (measure/validation.py) is not the model
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "src", ":!src/nnperf/measure/validation.py"],
                           capture_output=True, text=True).stdout
    return out.stdout.strip() + ("+uncommitted-model-code" if dirty.strip() else "")


def predict_row(config: Config, profile_path: Path) -> dict[str, Any]:
    """The model's predictions for ``config`` on the H200: datasheet entry and the calibration
    committed beside the first run's records."""
    from nnperf.analysis import analyze_request
    from nnperf.hardware import load_gpu
    from nnperf.hardware.profile import load_profile
    from nnperf.measure.runner import predicted_peak_memory
    from nnperf.prediction import predict_analysis

    gpu = load_gpu("h200-sxm")
    analysis = analyze_request(config.request(), config.trace_options())
    timing = config.timing_options()
    datasheet = predict_analysis(analysis, gpu, timing=timing)
    calibrated = predict_analysis(analysis, gpu, load_profile(profile_path, gpu), timing)
    return {
        "config": config.name, **config.to_json(),
        "params": int(analysis.totals["params"]),
        "predicted_step_time_s": datasheet.step.step_s,
        "predicted_step_time_calibrated_s": calibrated.step.step_s,
        "predicted_bound": datasheet.step.bound,
        "predicted_peak_memory_bytes": predicted_peak_memory(analysis, "cuda"),
    }


def freeze(out: Path) -> None:
    import torch

    profile = Path(__file__).parent / "data" / "h200-sxm" / "profile.toml"
    rows = []
    for i, config in enumerate(FRESH, 1):
        print(f"[{i}/{len(FRESH)}] {config.name}", file=sys.stderr, flush=True)
        rows.append(predict_row(config, profile))
    doc = {
        "schema": SCHEMA,
        "date": datetime.date.today().isoformat(),
        "model_commit": _commit(),
        "torch": torch.__version__,
        "gpu": "h200-sxm",
        "profile": str(profile.relative_to(Path(__file__).parent.parent)),
        "note": "frozen before any change for the fidelity issue (#35); first compared against these numbers",
        "configs": rows,
    }
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="verb", required=True)
    f = sub.add_parser("freeze", help="predict every fresh configuration with today's model and write the file")
    f.add_argument("-o", "--out", type=Path, required=True)
    ls = sub.add_parser("list", help="the configurations a frozen file lists")
    ls.add_argument("path", type=Path)
    ls.add_argument("--tiny", action="store_true")
    args = parser.parse_args(argv)
    if args.verb == "freeze":
        freeze(args.out)
    else:
        print("\n".join(c.name for c in load(args.path, args.tiny)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
