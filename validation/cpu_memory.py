"""Check the memory model's tensor lifetimes against real steps on the CPU.

    python validation/cpu_memory.py [--out validation/data/cpu-memory.json] [--only gpt2] [--update]

For every configuration below (each zoo model, small enough for a CPU: training with AdamW
and SGD, inference, fp32, bf16 and bf16 autocast, two batch sizes) it runs real steps on the
CPU and measures the peak of tensor memory from the CPU allocator's own reports (the
profiler's memory events, ``nnperf.measure.host_memory``), then writes one JSON file with
the machine, the versions and, per configuration, the measured peak and nnperf's prediction
(``nnperf.passes.memory.host.predict_host_memory``) at the time of the run.

What it checks: the lifetime replay every memory prediction stands on (when each tensor is
created, which are saved for backward, when autograd frees them, the optimizer's
temporaries), against the allocator of a real run. What it does not check: the CUDA caching
allocator's rounding and segments, cuBLAS/cuDNN workspaces and the kernels only CUDA has
(those need a GPU: ``validation/run.py``). Where the CPU runs a different kernel than the one
the trace models for a GPU (dropout decomposed into bernoulli and mul; attention with dropout
on the math path), the two differ by that kernel's memory; the records say so.

``tests/measure/test_cpu_memory_validation.py`` re-predicts every record with the current
code and holds each within the memory model's 5% bar.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path
from typing import Any

SCHEMA = "nnperf.cpu-memory-validation/1"

#: Zoo models at sizes a CPU measures in seconds; each row runs with the variants below.
MODELS: list[dict[str, Any]] = [
    {"model": "mlp", "batches": [16, 128]},
    {"model": "mnist-cnn", "batches": [8, 64]},
    {"model": "alexnet", "batches": [2, 8], "overrides": {"image_size": 96}},
    {"model": "alexnet-caffe", "batches": [1, 2]},
    {"model": "vgg16", "batches": [1, 4], "overrides": {"image_size": 32}},
    {"model": "resnet18", "batches": [2, 8], "overrides": {"image_size": 64}},
    {"model": "resnet50", "batches": [2, 8], "overrides": {"image_size": 64}},
    {"model": "mobilenet_v2", "batches": [2, 8], "overrides": {"image_size": 64}},
    {"model": "efficientnet_b0", "batches": [2, 8], "overrides": {"image_size": 64}},
    {"model": "efficientnet_b4", "batches": [1, 4], "overrides": {"image_size": 64}},
    {"model": "efficientnet_widese_b0", "batches": [2, 8], "overrides": {"image_size": 64}},
    {"model": "efficientnet_widese_b4", "batches": [1, 4], "overrides": {"image_size": 64}},
    {"model": "convnext_tiny", "batches": [2, 8], "overrides": {"image_size": 64}},
    {"model": "vit_b_16", "batches": [1, 4], "overrides": {"n_layer": 2, "image_size": 64}},
    {"model": "bert-base", "batches": [1, 4], "seq": 64, "overrides": {"n_layer": 2}},
    {"model": "bert-large", "batches": [1, 4], "seq": 64, "overrides": {"n_layer": 2}},
    {"model": "bert-large-squad", "batches": [1, 4], "seq": 64, "overrides": {"n_layer": 2}},
    {"model": "gpt2", "batches": [1, 4], "seq": 64, "overrides": {"n_layer": 2}},
    {"model": "gpt2-medium", "batches": [1, 2], "seq": 64, "overrides": {"n_layer": 1}},
    {"model": "gpt2-large", "batches": [1, 2], "seq": 64, "overrides": {"n_layer": 1}},
    {"model": "gpt2-xl", "batches": [1, 2], "seq": 64, "overrides": {"n_layer": 1}},
    {"model": "llama-7b", "batches": [1, 4], "seq": 64,
     "overrides": {"n_layer": 2, "dim": 512, "n_heads": 8, "ffn_hidden": 1376, "vocab": 4000}},
    {"model": "mixtral-8x7b", "batches": [1, 4], "seq": 64,
     "overrides": {"n_layer": 2, "dim": 512, "n_heads": 8, "n_kv_heads": 4, "ffn_hidden": 704, "vocab": 4000}},
    {"model": "deepseek-v3-16b", "batches": [1, 4], "seq": 64,  # one dense block, one MoE block
     "overrides": {"n_layer": 2, "dim": 512, "n_heads": 8, "kv_lora": 128, "qk_nope_dim": 32, "qk_rope_dim": 16,
                   "v_head_dim": 32, "ffn_hidden": 704, "moe_hidden": 128, "n_experts": 8, "top_k": 2, "vocab": 4000}},
]

#: Step variants: (name, train, optimizer, dtype, amp).
VARIANTS: list[tuple[str, bool, str, str | None, str | None]] = [
    ("train-adamw-fp32", True, "adamw", None, None),
    ("train-sgd-fp32", True, "sgd", None, None),
    ("train-adamw-bf16", True, "adamw", "bf16", None),
    ("train-adamw-amp-bf16", True, "adamw", None, "bf16"),
    ("inference-fp32", False, "adamw", None, None),
]


#: ``--loss`` variants, on decoders whose loss decides the peak (a large vocabulary over many
#: tokens, SGD keeping no optimizer state): each with the eager loss, the compiled one (checked
#: against inductor's own CPU kernels: ``torch.compile`` really runs) and, for a decoder with an
#: untied projection, the chunked one.
LOSS_MODELS: list[dict[str, Any]] = [
    {"model": "llama-7b", "batches": [2], "seq": 256, "losses": ["compiled", "chunked", "chunked-compiled"],
     "overrides": {"n_layer": 1, "dim": 256, "n_heads": 4, "ffn_hidden": 512, "vocab": 32000}},
    {"model": "gpt2", "batches": [2], "seq": 256, "losses": ["compiled"], "overrides": {"n_layer": 1}},
]
LOSS_VARIANT = ("train-sgd-amp-bf16", True, "sgd", None, "bf16")


def configurations() -> list[dict[str, Any]]:
    """Every (model, batch, variant) as a record's ``config`` dictionary."""
    out = []
    for row in MODELS + LOSS_MODELS:
        for batch in row["batches"]:
            variants = ([(*LOSS_VARIANT, loss) for loss in ["eager", *row["losses"]]] if "losses" in row
                        else [(*v, "eager") for v in VARIANTS])
            for name, train, optimizer, dtype, amp, loss in variants:
                out.append({
                    "name": f"{row['model']}-b{batch}-{name}" + (f"-loss-{loss}" if loss != "eager" else ""),
                    "model": row["model"], "batch": batch,
                    "seq": row.get("seq"), "overrides": row.get("overrides", {}), "train": train,
                    "optimizer": optimizer, "dtype": dtype, "amp": amp,
                    **({"loss": loss} if loss != "eager" else {}),
                    **({"loss_dominated": True} if "losses" in row else {}),
                })
    return out


def request_and_options(config: dict[str, Any]) -> tuple[Any, Any]:
    """The ``ModelRequest`` and ``TraceOptions`` a record's config stands for."""
    from nnperf.request import ModelRequest
    from nnperf.trace.options import TraceOptions

    request = ModelRequest(config["model"], batch=config["batch"], seq_len=config["seq"],
                           overrides=dict(config["overrides"]))
    options = TraceOptions(train=config["train"], optimizer=config["optimizer"],
                           dtype=config["dtype"], amp=config["amp"], autocast_device="cpu",
                           loss=config.get("loss", "eager"))
    return request, options


def run_one(config: dict[str, Any]) -> dict[str, Any]:
    import torch

    from nnperf.errors import UsageError
    from nnperf.measure.runner import measure, predicted_peak_memory

    request, options = request_and_options(config)
    try:
        m, analysis = measure(request, options, device=torch.device("cpu"), steps=1, warmup=2,
                              profile_ops=False)
    except UsageError as err:  # no CPU kernel for this dtype (e.g. bf16 avg_pool3d in LRN)
        return {"config": config, "error": str(err)}
    predicted = predicted_peak_memory(analysis, "cpu")
    return {"config": config, "measured_peak_bytes": m.peak_memory_bytes, "memory_method": m.memory_method,
            "predicted_peak_bytes_at_run": predicted}


def environment() -> dict[str, Any]:
    import torch

    from nnperf.measure.device import cpu_name

    return {
        "device": "cpu", "cpu": cpu_name(), "host": platform.node(), "python": platform.python_version(),
        "torch": torch.__version__, "threads": torch.get_num_threads(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="validation/data/cpu-memory.json")
    parser.add_argument("--only", action="append", default=[], help="substring of config names (repeatable)")
    parser.add_argument("--update", action="store_true",
                        help="replace or add these records in --out, keep the others (same machine only)")
    args = parser.parse_args(argv)
    configs = [c for c in configurations() if not args.only or any(s in c["name"] for s in args.only)]
    records = []
    for i, config in enumerate(configs, 1):
        record = run_one(config)
        records.append(record)
        if "error" in record:
            print(f"[{i}/{len(configs)}] {config['name']:<45} not measured: {record['error']}", flush=True)
            continue
        m, p = record["measured_peak_bytes"], record["predicted_peak_bytes_at_run"]
        print(f"[{i}/{len(configs)}] {config['name']:<45} measured {m / 2**20:9.2f} MiB  "
              f"predicted {p / 2**20:9.2f} MiB  {100 * (p - m) / m:+6.2f}%", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    env = environment()
    if args.update and out.exists():
        old = json.loads(out.read_text())
        if (old["environment"]["cpu"], old["environment"]["torch"]) != (env["cpu"], env["torch"]):
            print(f"error: {out} was measured on another CPU or torch; run without --update", file=sys.stderr)
            return 2
        fresh = {r["config"]["name"] for r in records}
        records = [r for r in old["records"] if r["config"]["name"] not in fresh] + records
        order = {c["name"]: i for i, c in enumerate(configurations())}
        records.sort(key=lambda r: order.get(r["config"]["name"], len(order)))
    doc = {"schema": SCHEMA, "script": "validation/cpu_memory.py", "environment": env,
           "records": records}
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {len(records)} records to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
