"""Host-bound steps measured eager and replayed as a CUDA graph: the advice item cuda-graphs'
test set (issue 17), measured where the published gpt-fast figure could only be reproduced.

    python validation/cuda_graphs.py --out $OUT/cuda-graphs.json          # on a lent GPU
    python validation/cuda_graphs.py --compare validation/data/<gpu>/cuda-graphs.json

Each workload is one inference forward (decoding one token at batch 1, as nnperf's
``advise llama-7b --batch 1 --seq-len 1 --no-train`` traces it). Weights are random normal
(never zeros), made on the device from a meta model so that a 7B model needs no host copy.
Times are wall-clock per step over back-to-back steps after warm-up (a host-bound step's
time is the host's, which CUDA events alone would miss), median of repeats; the device's busy
time per step is taken from CUDA events around the graph's replays. ``--compare`` prints
nnperf's prediction for the same workloads on the recorded GPU beside the measurement.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

#: name -> (zoo model, batch, seq_len, overrides)
WORKLOADS: dict[str, tuple[str, int, int, dict[str, Any]]] = {
    "llama-7b-decode-b1": ("llama-7b", 1, 1, {}),
    "gpt2-decode-b1": ("gpt2", 1, 1, {}),
    "gpt2-xl-decode-b1": ("gpt2-xl", 1, 1, {}),
}
STEPS, WARMUP, REPEATS = 50, 10, 5


def _build_on(device: Any, spec: tuple[str, int, int, dict[str, Any]]) -> tuple[Any, tuple[Any, ...]]:
    import torch

    from nnperf.zoo import get_model

    model_name, batch, seq, overrides = spec
    with torch.device("meta"):
        workload = get_model(model_name).build(batch=batch, seq_len=seq, **overrides)
    model = workload.model.to_empty(device=device).to(torch.bfloat16).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
        for b in model.buffers():
            b.normal_(0.0, 0.02) if b.is_floating_point() else b.zero_()
    inputs = tuple(torch.randint(0, 1000, tuple(x.shape), device=device) if not x.is_floating_point()
                   else torch.randn(tuple(x.shape), device=device, dtype=torch.bfloat16)
                   for x in workload.inputs)
    return model, inputs


def _wall_per_step(fn: Any, sync: Any) -> float:
    for _ in range(WARMUP):
        fn()
    sync()
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        for _ in range(STEPS):
            fn()
        sync()
        times.append((time.perf_counter() - start) / STEPS)
    return statistics.median(times)


def measure_one(device: Any, spec: tuple[str, int, int, dict[str, Any]]) -> dict[str, Any]:
    import torch

    model, inputs = _build_on(device, spec)
    sync = torch.cuda.synchronize
    with torch.no_grad():
        eager_s = _wall_per_step(lambda: model(*inputs), sync)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                model(*inputs)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            model(*inputs)
        graphed_s = _wall_per_step(graph.replay, sync)
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(STEPS):
            graph.replay()
        end.record()
        sync()
        device_s = begin.elapsed_time(end) / 1e3 / STEPS
    graph.reset()
    torch.cuda.empty_cache()
    return {"eager_step_s": eager_s, "graphed_step_s": graphed_s, "graphed_device_s": device_s,
            "speedup": eager_s / graphed_s, "steps": STEPS, "warmup": WARMUP, "repeats": REPEATS}


def record(out: Path) -> None:
    import torch

    from nnperf.measure.runner import environment

    device = torch.device("cuda")
    result: dict[str, Any] = {"environment": environment(device), "workloads": {}}
    for name, spec in WORKLOADS.items():
        try:
            entry = {"model": spec[0], "batch": spec[1], "seq_len": spec[2], **measure_one(device, spec)}
        except Exception as err:  # one workload's failure is a record, not the end of the run
            entry = {"model": spec[0], "error": f"{type(err).__name__}: {err}"}
        result["workloads"][name] = entry
        out.write_text(json.dumps(result, indent=1))  # as we go: a run cut short keeps its work
        print(name, {k: v for k, v in entry.items() if k != "model"}, file=sys.stderr, flush=True)


def compare(path: Path) -> None:
    from nnperf.hardware import load_gpu
    from nnperf.search.advise import advise

    recorded = json.loads(path.read_text())
    gpu = load_gpu(recorded["environment"]["gpu"]).id
    for name, entry in recorded["workloads"].items():
        if "error" in entry:
            print(f"{name}: {entry['error']}")
            continue
        result = advise(entry["model"], gpu, apply=["cuda-graphs"], batch=entry["batch"],
                        seq_len=entry["seq_len"], dtype="bf16", train=False, workers=1).combination
        ms = 1e3
        print(f"{name} on {gpu}: eager measured {entry['eager_step_s'] * ms:.2f} ms, predicted "
              f"{result.before.step_s * ms:.2f} ms; graphed measured {entry['graphed_step_s'] * ms:.2f} ms, "
              f"predicted {result.after.step_s * ms:.2f} ms; gain measured {entry['speedup'] - 1:+.0%}, "
              f"predicted {result.speedup - 1:+.0%}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the measurements here (JSON)")
    parser.add_argument("--compare", type=Path, help="a recorded JSON: print nnperf's predictions beside it")
    args = parser.parse_args(argv)
    if args.compare:
        compare(args.compare)
    elif args.out:
        record(args.out)
    else:
        parser.error("give --out (on a GPU) or --compare")
    return 0


if __name__ == "__main__":
    sys.exit(main())
