"""The ops a real CUDA step runs beside the ops nnperf's trace records for the same step.

    python validation/cuda_ops.py --device cuda --out $OUT/cuda-ops.json    # on a lent GPU
    python validation/cuda_ops.py --compare validation/data/<gpu>/cuda-ops.json
    python validation/cuda_ops.py --device cpu --out /tmp/cpu-ops.json      # dry run

The trace runs on the CPU's dispatch path and substitutes what CUDA runs where the two differ
(fused attention, cuDNN RNNs, CUDA's autocast lists, fused dropout): ``nnperf.measure.op_lists``
says how. Recorded once on a GPU and committed, the device's op counts let CI check every
substitution (``tests/measure/test_op_lists.py``): each workload's difference must be empty
or one of ``KNOWN`` below, with its reason. The workloads cover the substitutions: SDPA under
autocast and in fp32, dropout, LayerNorm/softmax/loss under CUDA's autocast lists, batch norm
and convolutions with and without channels_last, a bf16 model, fused and foreach AdamW, and
cuDNN's LSTM under autocast.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

#: name -> (zoo model or "lstm-lm" (below), batch, seq, overrides, TraceOptions fields)
WORKLOADS: dict[str, tuple[str, int, int | None, dict[str, Any], dict[str, Any]]] = {
    "gpt2-amp-bf16": ("gpt2", 2, 128, {"n_layer": 2}, {"amp": "bf16"}),
    "gpt2-fp32": ("gpt2", 2, 128, {"n_layer": 2}, {}),
    "gpt2-amp-fp16-scaler": ("gpt2", 2, 128, {"n_layer": 2}, {"amp": "fp16"}),
    "bert-amp-bf16-fused-adamw": ("bert-base", 2, 128, {"n_layer": 2}, {"amp": "bf16", "optimizer_impl": "fused"}),
    "llama-bf16": ("llama-7b", 1, 128, {"n_layer": 2, "dim": 512, "n_heads": 8, "n_kv_heads": 2,
                                        "ffn_hidden": 1024, "vocab": 1000}, {"dtype": "bf16"}),
    "resnet18-amp-bf16": ("resnet18", 8, None, {"image_size": 64}, {"amp": "bf16"}),
    "resnet18-amp-bf16-channels-last": ("resnet18", 8, None, {"image_size": 64},
                                        {"amp": "bf16", "channels_last": True}),
    "mobilenet-v2-fp32": ("mobilenet_v2", 8, None, {"image_size": 64}, {}),
    "vit-amp-bf16-inference": ("vit_b_16", 8, None, {"n_layer": 2, "image_size": 64},
                               {"amp": "bf16", "train": False}),
    "lstm-lm-amp-bf16": ("lstm-lm", 8, 64, {}, {"amp": "bf16"}),
}
#: workload -> {"diff": the difference a GPU's op list is known to show (``differences``' form),
#: "why": its reason}. A difference not listed fails the test.
KNOWN: dict[str, dict[str, Any]] = {
    "lstm-lm-amp-bf16": {
        "diff": {"device_only": {"aten.add": 1, "aten.clone": 1, "aten.copy_": 8, "aten.mm": 1, "aten.set_": 9,
                                 "aten.zeros": 1},
                 "trace_only": {"aten._to_copy": 8, "aten.addmm": 1}},
        "why": "H200, torch 2.11, 2026-11-28. cuDNN's RNN under autocast casts the 8 weights into one new "
               "flat bf16 buffer (zeros, then a casting copy_ into each set_ view) where the trace casts "
               "each with _to_copy: the same bytes cast, plus one fill of the buffer. The output "
               "projection then runs as clone + mm + add where the trace has one addmm: the RNN's "
               "output reaches it in a layout the folded addmm cannot take. Not modelled (one fill, one "
               "copy of the LSTM's output per step).",
    },
}


def _build(spec: tuple) -> Any:
    from nnperf.zoo import get_model

    model, batch, seq, overrides, _ = spec
    if model == "lstm-lm":
        return lambda: _lstm_lm(batch, seq)
    return lambda: get_model(model).build(batch=batch, seq_len=seq, **overrides)


def _lstm_lm(batch: int, seq: int) -> Any:
    """A 2-layer LSTM language model (the zoo has no RNN): cuDNN's RNN on the device, the
    trace's ``nnperf.cudnn_rnn`` stand-in."""
    import torch
    from torch import nn

    from nnperf.workload import Workload

    vocab, width = 1000, 256

    class LstmLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, width)
            self.lstm = nn.LSTM(width, width, num_layers=2, batch_first=True)
            self.head = nn.Linear(width, vocab)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.head(self.lstm(self.embed(ids))[0])

    ids = torch.randint(0, vocab, (batch, seq))
    return Workload(LstmLM(), (ids,), loss_fn=lambda logits: nn.functional.cross_entropy(
        logits.flatten(0, 1).float(), ids.flatten()))


def record(device_name: str, only: str = "") -> dict[str, Any]:
    import torch

    from nnperf.measure.op_lists import device_step_ops
    from nnperf.measure.runner import environment
    from nnperf.trace.options import TraceOptions

    device = torch.device(device_name)
    out: dict[str, Any] = {"device_type": device.type, "environment": environment(device), "workloads": {}}
    for name, spec in WORKLOADS.items():
        if not name.startswith(only):
            continue
        options = TraceOptions(**spec[4], autocast_device=device.type)
        start = time.perf_counter()
        try:
            counts = device_step_ops(_build(spec), options, device)
        except Exception as err:  # one workload's failure is a record, not the end of the run
            out["workloads"][name] = {"error": f"{type(err).__name__}: {err}"}
            continue
        out["workloads"][name] = {"ops": dict(sorted(counts.items())),
                                  "seconds": round(time.perf_counter() - start, 2)}
        print(f"{name}: {sum(counts.values())} ops", file=sys.stderr, flush=True)
    return out


def differences(recorded: dict[str, Any]) -> dict[str, Any]:
    """Each recorded workload's difference from nnperf's trace of the same step."""
    from collections import Counter

    from nnperf.measure.op_lists import compare, trace_ops
    from nnperf.trace.capture import trace_workload
    from nnperf.trace.options import TraceOptions

    device_type = recorded.get("device_type", "cuda")
    result: dict[str, Any] = {}
    for name, entry in recorded["workloads"].items():
        if "ops" not in entry or name not in WORKLOADS:
            continue
        spec = WORKLOADS[name]
        options = TraceOptions(**spec[4], autocast_device="cpu" if device_type == "cpu" else "cuda")
        trace, _ = trace_workload(_build(spec), options)
        diff = compare(Counter(entry["ops"]), trace_ops(trace))
        result[name] = {"device_only": diff.device_only, "trace_only": diff.trace_only}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", help="write the recorded op counts here (JSON)")
    parser.add_argument("--only", default="", help="workloads whose name starts with this")
    parser.add_argument("--compare", help="a recorded JSON: print its differences from the trace")
    args = parser.parse_args(argv)
    if args.compare:
        diffs = differences(json.loads(Path(args.compare).read_text()))
        for name, diff in diffs.items():
            verdict = "same" if not diff["device_only"] and not diff["trace_only"] else json.dumps(diff)
            print(f"{name}: {verdict}")
        return 0
    recorded = record(args.device, args.only)
    text = json.dumps(recorded, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
