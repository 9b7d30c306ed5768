"""Kernel microbenchmarks on the paths the H200 runs found mispredicted (issues 35 and 36).

    python validation/kernel_bench.py --device cuda --out $OUT/kernel-bench.json   # ~90 s on an H200
    python validation/kernel_bench.py --device cpu --out /tmp/kb.json --quick        # dry run

What it times, each with ``torch.backends.cudnn.benchmark`` off and on (where it can matter):

- batch norm forward (training), forward + backward and evaluation forward: bf16 inputs with
  fp32 parameters (what bf16 autocast hands it: PyTorch's native kernels), fp16 inputs with
  fp32 parameters (fp16 autocast: cuDNN) and fp32 (cuDNN), NCHW and channels-last, at ResNet's
  shapes (64 channels at 112x112, 256 at 56x56, 1024 at 14x14, batch 64);
- max pooling 3x3 stride 2 forward and forward + backward (ResNet's stem pool);
- the 3-channel stem convolution (7x7 stride 2, 3 -> 64 at 224x224), forward and with its
  weight gradient;
- depthwise convolutions (3x3, 5x5, 7x7) forward and forward + backward;
- a grouped convolution's backward (AlexNet's 2-group 3x3 384 -> 384 at 13x13) and a dense
  3x3 one's (64 -> 64 at 56x56: the NCHW conversions around each gradient's kernels);
- layer norm forward and forward + backward at decoder widths (the small-kernel floor);
- a linear layer with a vocabulary of 50257 outputs and with 50304 (misaligned against aligned),
  bf16 and TF32;
- a bf16 GEMM held busy for a few seconds: its rate early and late, with SM clock samples (what
  the calibration's clock readings mean against the rate the GEMMs reach).

Every row carries the aten ops one call dispatched (``nnperf.measure.op_lists.record_ops``:
``native_batch_norm`` against ``cudnn_batch_norm`` says which backend ran). Times: CUDA events
around queued calls after warm-up (``nnperf.measure.device.time_batched``), the median of the
repeats, random operands. The JSON file is rewritten whole after every row (through a temporary
file and a rename), so a killed run leaves every finished row. ``--device cpu`` runs the same
code paths with tiny sizes, as a dry run (``tests/validation/test_kernel_bench.py``).
``nnperf calibrate`` folds the file's rows into a profile (``--kernel-bench``;
``nnperf.measure.calibration.kernel_bench``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from nnperf.measure.calibration.host_info import sm_clock_mhz
from nnperf.measure.device import resolve_device, synchronize, time_batched
from nnperf.measure.op_lists import record_ops
from nnperf.measure.runner import environment
from nnperf.measure.stats import Spread

SCHEMA = "nnperf.kernel_bench/1"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
#: Ops worth naming in a row (the backend a call took): everything else is bookkeeping.
_OP_WORDS = ("norm", "conv", "pool", "mm", "linear", "addmm")


@dataclass(frozen=True)
class Sizes:
    """Shapes per device: the GPU's are the networks' own, the CPU's tiny (a dry run)."""

    batch_norm: tuple[tuple[int, int, int], ...]  # (batch, channels, height = width)
    pool: tuple[int, int, int]
    stem: tuple[int, int]  # (batch, image size)
    depthwise: tuple[tuple[int, int, int, int], ...]  # (batch, channels, size, kernel)
    grouped: tuple[int, int, int]  # (batch, channels, size)
    dense: tuple[int, int, int]  # (batch, channels, size) of a 3x3 convolution
    layer_norm: tuple[tuple[int, int], ...]  # (rows, width)
    linear: tuple[int, int, tuple[int, ...]]  # (tokens, width, vocabularies)
    gemm: int  # the sustained GEMM's side
    sustain_s: float
    repeats: int
    min_time_s: float  # each repeat's calls last at least this long (time_batched)


GPU_SIZES = Sizes(
    batch_norm=((64, 64, 112), (64, 256, 56), (64, 1024, 14)),
    pool=(64, 64, 112), stem=(64, 224),
    depthwise=((32, 144, 56, 3), (32, 240, 28, 5), (32, 96, 56, 7)),
    grouped=(128, 384, 13), dense=(32, 64, 56), layer_norm=((8192, 768), (8192, 1600), (12608, 768)),
    linear=(8192, 768, (50257, 50304)), gemm=8192, sustain_s=4.0, repeats=10, min_time_s=2e-3,
)
CPU_SIZES = Sizes(
    batch_norm=((2, 4, 8), (2, 8, 4)), pool=(2, 4, 8), stem=(2, 16), depthwise=((2, 8, 8, 3),),
    grouped=(2, 8, 5), dense=(2, 8, 6), layer_norm=((16, 32),), linear=(16, 32, (67, 72)), gemm=64, sustain_s=0.2, repeats=3,
    min_time_s=1e-6,
)


class Results:
    """The output document, rewritten atomically after each row."""

    def __init__(self, path: Path, header: dict[str, Any]) -> None:
        self.path = path
        self.doc: dict[str, Any] = {**header, "rows": [], "complete": False}
        self.write()

    def add(self, row: dict[str, Any]) -> None:
        self.doc["rows"].append(row)
        self.write()

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(self.doc, f, indent=1)
            f.write("\n")
        os.replace(tmp, self.path)


@contextlib.contextmanager
def cudnn_benchmark(on: bool) -> Iterator[None]:
    previous = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = on
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = previous


def _fmt(layout: str) -> torch.memory_format:
    return torch.channels_last if layout == "channels_last" else torch.contiguous_format


def _rand(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, layout: str = "nchw",
          grad: bool = False) -> torch.Tensor:
    """Random values (never zeros: they can take fast paths) in the layout asked for."""
    t = torch.randn(shape, device=device, dtype=torch.float32).to(dtype)
    if len(shape) == 4:
        t = t.contiguous(memory_format=_fmt(layout))
    return t.requires_grad_(grad)


def _ops(fn: Callable[[], object]) -> dict[str, int]:
    counts = record_ops(fn)
    return {k: v for k, v in sorted(counts.items()) if any(w in k for w in _OP_WORDS)}


def _timed(fn: Callable[[], object], device: torch.device, sizes: Sizes) -> dict[str, Any]:
    spread = Spread.of(time_batched(fn, device, repeats=sizes.repeats, min_time_s=sizes.min_time_s,
                                    device_only=True))
    return {"time_s": spread.median, "spread": spread.to_json()}


def _measure(results: Results, device: torch.device, sizes: Sizes, facts: dict[str, Any],
             passes: dict[str, Callable[[], object]], benchmark_modes: tuple[bool, ...] = (False, True)) -> None:
    """One row per pass and cudnn.benchmark setting; a pass the device refuses is recorded
    with its reason."""
    for on in benchmark_modes:
        with cudnn_benchmark(on):
            for name, fn in passes.items():
                row = {**facts, "pass": name, "cudnn_benchmark": on}
                try:
                    row["ops"] = _ops(fn)
                    row.update(_timed(fn, device, sizes))
                except (RuntimeError, NotImplementedError) as err:
                    row["skipped"] = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
                results.add(row)


def _backward(fn: Callable[[], torch.Tensor], grad: torch.Tensor, leaves: list[torch.Tensor]) -> Callable[[], None]:
    def step() -> None:
        for t in leaves:
            t.grad = None
        fn().backward(grad)
    return step


def batch_norm(results: Results, device: torch.device, sizes: Sizes) -> None:
    """Training forward, forward + backward and evaluation forward per dtype and layout; the
    parameters and running statistics fp32 whatever the input (autocast's hand-off)."""
    for batch, channels, hw in sizes.batch_norm:
        for dtype in DTYPES:
            for layout in ("nchw", "channels_last"):
                x = _rand((batch, channels, hw, hw), DTYPES[dtype], device, layout, grad=True)
                weight, bias = _rand((channels,), torch.float32, device, grad=True), _rand((channels,), torch.float32, device, grad=True)
                mean, var = torch.zeros(channels, device=device), torch.ones(channels, device=device)
                grad = _rand(tuple(x.shape), DTYPES[dtype], device, layout)

                def train(x=x, weight=weight, bias=bias, mean=mean, var=var) -> torch.Tensor:
                    return F.batch_norm(x, mean, var, weight, bias, training=True)

                def forward(train=train) -> None:
                    with torch.no_grad():
                        train()

                def evaluate(x=x, weight=weight, bias=bias, mean=mean, var=var) -> None:
                    with torch.no_grad():
                        F.batch_norm(x, mean, var, weight, bias, training=False)

                facts = {"kind": "batch_norm", "dtype": dtype, "parameter_dtype": "fp32", "layout": layout,
                         "batch": batch, "channels": channels, "hw": hw}
                _measure(results, device, sizes, facts,
                         {"forward": forward, "forward_backward": _backward(train, grad, [x, weight, bias]),
                          "eval": evaluate}, benchmark_modes=(False,))  # cudnn.benchmark: convolutions only


def max_pool(results: Results, device: torch.device, sizes: Sizes) -> None:
    batch, channels, hw = sizes.pool
    for dtype in ("bf16", "fp32"):
        for layout in ("nchw", "channels_last"):
            x = _rand((batch, channels, hw, hw), DTYPES[dtype], device, layout, grad=True)
            out = (hw + 2 - 3) // 2 + 1
            grad = _rand((batch, channels, out, out), DTYPES[dtype], device, layout)

            def pool(x=x) -> torch.Tensor:
                return F.max_pool2d(x, 3, 2, 1)

            def forward(pool=pool) -> None:
                with torch.no_grad():
                    pool()

            facts = {"kind": "max_pool", "dtype": dtype, "layout": layout, "batch": batch, "channels": channels,
                     "hw": hw, "kernel": 3, "stride": 2, "padding": 1}
            _measure(results, device, sizes, facts, {"forward": forward, "forward_backward": _backward(pool, grad, [x])},
                     benchmark_modes=(False,))


def _conv_rows(results: Results, device: torch.device, sizes: Sizes, kind: str, batch: int, cin: int, cout: int,
               hw: int, kernel: int, stride: int, groups: int, input_grad: bool,
               dtypes: tuple[str, ...] = ("bf16", "fp16", "fp32")) -> None:
    pad = kernel // 2
    out = (hw + 2 * pad - kernel) // stride + 1
    for dtype in dtypes:
        for layout in ("nchw", "channels_last"):
            x = _rand((batch, cin, hw, hw), DTYPES[dtype], device, layout, grad=input_grad)
            w = _rand((cout, cin // groups, kernel, kernel), DTYPES[dtype], device, layout, grad=True)
            grad = _rand((batch, cout, out, out), DTYPES[dtype], device, layout)

            def conv(x=x, w=w) -> torch.Tensor:
                return F.conv2d(x, w, stride=stride, padding=pad, groups=groups)

            def forward(conv=conv) -> None:
                with torch.no_grad():
                    conv()

            facts = {"kind": kind, "dtype": dtype, "tf32": dtype == "fp32", "layout": layout, "batch": batch,
                     "in_channels": cin, "out_channels": cout, "hw": hw, "kernel": kernel, "stride": stride,
                     "groups": groups, "input_grad": input_grad}
            leaves = [x, w] if input_grad else [w]
            with tf32(dtype == "fp32"):
                _measure(results, device, sizes, facts,
                         {"forward": forward, "forward_backward": _backward(conv, grad, leaves)})


@contextlib.contextmanager
def tf32(on: bool) -> Iterator[None]:
    """cuDNN's TF32 switch (PyTorch's default is on) and cuBLAS's (off by default)."""
    previous = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = on
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = previous


def convolutions(results: Results, device: torch.device, sizes: Sizes) -> None:
    batch, image = sizes.stem
    _conv_rows(results, device, sizes, "stem", batch, 3, 64, image, 7, 2, 1, input_grad=False)
    for batch, channels, hw, kernel in sizes.depthwise:
        _conv_rows(results, device, sizes, "depthwise", batch, channels, channels, hw, kernel, 1, channels,
                   input_grad=True)
    batch, channels, hw = sizes.grouped
    _conv_rows(results, device, sizes, "grouped", batch, channels, channels, hw, 3, 1, 2, input_grad=True,
               dtypes=("bf16",))
    batch, channels, hw = sizes.dense  # the NCHW conversions around each gradient's kernels
    _conv_rows(results, device, sizes, "dense", batch, channels, channels, hw, 3, 1, 1, input_grad=True)


def layer_norm(results: Results, device: torch.device, sizes: Sizes) -> None:
    for rows, width in sizes.layer_norm:
        x = _rand((rows, width), torch.bfloat16, device, grad=True)
        weight, bias = _rand((width,), torch.bfloat16, device, grad=True), _rand((width,), torch.bfloat16, device, grad=True)
        grad = _rand((rows, width), torch.bfloat16, device)

        def norm(x=x, weight=weight, bias=bias, width=width) -> torch.Tensor:
            return F.layer_norm(x, (width,), weight, bias)

        def forward(norm=norm) -> None:
            with torch.no_grad():
                norm()

        facts = {"kind": "layer_norm", "dtype": "bf16", "rows": rows, "width": width}
        _measure(results, device, sizes, facts,
                 {"forward": forward, "forward_backward": _backward(norm, grad, [x, weight, bias])},
                 benchmark_modes=(False,))


def linear(results: Results, device: torch.device, sizes: Sizes) -> None:
    tokens, width, vocabularies = sizes.linear
    for dtype in ("bf16", "fp32"):
        for vocab in vocabularies:
            x = _rand((tokens, width), DTYPES[dtype], device, grad=True)
            w = _rand((vocab, width), DTYPES[dtype], device, grad=True)
            grad = _rand((tokens, vocab), DTYPES[dtype], device)

            def project(x=x, w=w) -> torch.Tensor:
                return F.linear(x, w)

            def forward(project=project) -> None:
                with torch.no_grad():
                    project()

            facts = {"kind": "linear", "dtype": dtype, "tf32": dtype == "fp32", "m": tokens, "n": vocab, "k": width}
            with tf32(dtype == "fp32"):
                _measure(results, device, sizes, facts,
                         {"forward": forward, "forward_backward": _backward(project, grad, [x, w])},
                         benchmark_modes=(False,))


def sustained_gemm(results: Results, device: torch.device, sizes: Sizes) -> None:
    """A bf16 GEMM back to back for ``sustain_s``: the rate of each batch of calls (CUDA events)
    and the SM clock read after each batch was queued, first second against last."""
    n = sizes.gemm
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a, b = _rand((n, n), dtype, device), _rand((n, n), dtype, device)
    calls = 8
    flops = 2.0 * n**3 * calls
    samples: list[dict[str, float]] = []
    start = time.perf_counter()
    synchronize(device)
    while time.perf_counter() - start < sizes.sustain_s:
        if device.type == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            for _ in range(calls):
                torch.mm(a, b)
            end.record()
            clock = sm_clock_mhz(device.index or 0)
            end.synchronize()
            seconds = begin.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            for _ in range(calls):
                torch.mm(a, b)
            seconds, clock = time.perf_counter() - t0, None
        samples.append({"at_s": time.perf_counter() - start, "flops_per_s": flops / seconds,
                        "sm_clock_mhz": clock})
    first = [s for s in samples if s["at_s"] <= 1.0] or samples[:1]
    last = [s for s in samples if s["at_s"] >= sizes.sustain_s - 1.0] or samples[-1:]

    def summary(part: list[dict[str, float]]) -> dict[str, Any]:
        clocks = [s["sm_clock_mhz"] for s in part if s["sm_clock_mhz"]]
        return {"flops_per_s": Spread.of([s["flops_per_s"] for s in part]).median,
                "sm_clock_mhz": Spread.of(clocks).median if clocks else None}

    results.add({"kind": "sustained_gemm", "dtype": "bf16" if dtype == torch.bfloat16 else "fp32", "n": n,
                 "seconds": sizes.sustain_s, "first_second": summary(first), "last_second": summary(last),
                 "samples": samples})


BENCHMARKS = (batch_norm, max_pool, convolutions, layer_norm, linear, sustained_gemm)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (the measurement) or cpu (a dry run, tiny sizes)")
    parser.add_argument("--out", type=Path, required=True, help="the JSON file to write (rewritten after each row)")
    parser.add_argument("--quick", action="store_true", help="fewer repeats and a shorter sustained GEMM")
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    sizes = GPU_SIZES if device.type == "cuda" else CPU_SIZES
    if args.quick:
        sizes = dataclasses.replace(sizes, repeats=2, sustain_s=min(sizes.sustain_s, 0.2))
    torch.manual_seed(0)
    results = Results(args.out, {"schema": SCHEMA, "device": str(device), "quick": args.quick,
                                 "environment": environment(device)})
    begin = time.perf_counter()
    for bench in BENCHMARKS:
        bench(results, device, sizes)
        print(f"kernel_bench: {bench.__name__} done at {time.perf_counter() - begin:.1f} s, "
              f"{len(results.doc['rows'])} rows", flush=True)
    results.doc["complete"] = True
    results.doc["seconds"] = time.perf_counter() - begin
    results.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
