"""Profile constants from ``validation/kernel_bench.py``'s rows (a GPU session's kernel-bench.json).

The calibration's own microbenchmarks time GEMMs, convolutions and copies; the kernel bench
times the kernels PyTorch runs on the paths the H200 runs found mispredicted: native batch norm,
max pooling, the RGB stem, depthwise convolutions. This module turns its rows into the profile
fields the time model reads for those kernels:

- ``loop_iteration_cycles`` (``kernels.native_loops``): for every NCHW batch-norm row that ran
  PyTorch's native kernels (its ``ops`` name ``native_batch_norm``), the round trip that makes
  the modeled launches (``kernels.batch_norm.launches``: the training forward, the evaluation
  forward, and the backward as the forward + backward row less the forward row) take the
  measured time; rows a bandwidth floor already explains inform nothing; the median;
- ``cudnn_batch_norm_loop_fraction``: the same solve over the NCHW rows cuDNN ran (fp16 and
  fp32 training, ``cudnn_batch_norm``: its loops, ``kernels.batch_norm.launches``), their median
  over the native median;
- ``depthwise_rate``: the depthwise forward rows (``cudnn.benchmark`` off), as the calibration's
  convolution variants are read (``profile.depthwise_rates``);
- ``conv_efficiency["low_channel_forward"]``: the stem rows' forward pass on NCHW tensors, as
  the calibration's stem row is read (``profile.low_channel_efficiency``).

``cudnn.benchmark`` rows are kept in the file; no constant is derived from them yet.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nnperf.errors import UsageError, shown
from nnperf.hardware import GPU, DeviceProfile
from nnperf.kernels import batch_norm as bn
from nnperf.kernels.native_loops import CUDNN, NATIVE, LoopKernel, loop_kernel_time
from nnperf.measure.calibration.record import TIMING_DEVICE, Calibration
from nnperf.measure.stats import Spread

SCHEMA = "nnperf.kernel_bench/1"
ITEMSIZE = {"bf16": 2, "fp16": 2, "fp32": 4}


def load_kernel_bench(path: str | Path) -> dict[str, Any]:
    """A kernel-bench JSON file; a missing, malformed or foreign file is a usage error."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except OSError as err:
        raise UsageError(f"--kernel-bench {shown(str(path))}: cannot read it ({err.strerror})") from None
    except json.JSONDecodeError as err:
        raise UsageError(f"--kernel-bench {shown(str(path))} is not JSON: {err}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or not isinstance(doc.get("rows"), list):
        raise UsageError(f"--kernel-bench {shown(str(path))} is not a kernel-bench file (schema {SCHEMA!r}, "
                         "written by validation/kernel_bench.py)")
    return doc


def _timed(rows: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [r for r in rows if r.get("kind") == kind and "time_s" in r and not r.get("cudnn_benchmark")]


def _solve_cycles(loops: tuple[LoopKernel, ...], small: int, measured: float, gpu: GPU,
                  profile: DeviceProfile) -> float | None:
    """The ``loop_iteration_cycles`` at which ``loops`` plus ``small`` launches take
    ``measured`` seconds (the modeled time rises with it); None where even the bandwidth floor
    alone reaches the measurement, or a loop-free plan. The loops' own round trip, whichever
    library's: solved with cuDNN's fraction at 1."""
    profile = profile.replace(cudnn_batch_norm_loop_fraction=1.0)
    if not loops:
        return None

    def modeled(cycles: float) -> float:
        p = profile.replace(loop_iteration_cycles=cycles)
        return sum(loop_kernel_time(k, gpu, p) for k in loops) + (len(loops) + small) * profile.kernel_overhead_s

    low, high = 1.0, 1e6
    if modeled(low) >= measured or modeled(high) <= measured:
        return None
    for _ in range(100):
        mid = (low * high) ** 0.5
        low, high = (mid, high) if modeled(mid) < measured else (low, mid)
    return (low * high) ** 0.5


def _bn_call(row: dict[str, Any], training: bool, backward: bool) -> bn.BatchNormCall:
    n, c, hw = row["batch"], row["channels"], row["hw"]
    return bn.BatchNormCall(
        batch=n, channels=c, spatial=hw * hw, itemsize=ITEMSIZE[row["dtype"]], input_dtype=row["dtype"],
        weight_dtype=row.get("parameter_dtype", "fp32"), has_bias=True, running_stats=True, training=training,
        backward=backward, want_input_grad=True, want_param_grads=True, channels_last=False, contiguous=True,
        eps=1e-5, numel=n * c * hw * hw)


def loop_cycles(rows: list[dict[str, Any]], gpu: GPU, profile: DeviceProfile, library: str = NATIVE) -> float | None:
    """The round trip of the NCHW batch-norm rows' loops (module docstring): PyTorch's native
    kernels' (``library`` NATIVE: ``loop_iteration_cycles``) or cuDNN's (CUDNN), read from the
    op each row ran (``aten.native_batch_norm`` / ``aten.cudnn_batch_norm``)."""
    op = f"{library}_batch_norm"
    chosen = [r for r in _timed(rows, "batch_norm")
              if r.get("layout") == "nchw" and any(op in name for name in r.get("ops", {}))]
    cudnn = library == CUDNN
    forward = {(r["dtype"], r["batch"], r["channels"], r["hw"]): r for r in chosen if r["pass"] == "forward"}
    found = []
    for r in chosen:
        if r["pass"] in ("forward", "eval"):
            plan = bn.launches(_bn_call(r, training=r["pass"] == "forward", backward=False), cudnn=cudnn)
            measured = r["time_s"]
        elif r["pass"] == "forward_backward" and (r["dtype"], r["batch"], r["channels"], r["hw"]) in forward:
            plan = bn.launches(_bn_call(r, training=True, backward=True), cudnn=cudnn)
            measured = r["time_s"] - forward[(r["dtype"], r["batch"], r["channels"], r["hw"])]["time_s"]
        else:
            continue
        cycles = _solve_cycles(plan.loops, plan.small + plan.streamed, measured, gpu, profile)
        if cycles is not None:
            found.append(cycles)
    return Spread.of(found).median if found else None


def _as_variant(row: dict[str, Any]) -> dict[str, Any]:
    """A kernel-bench convolution row in the shape of the calibration's convolution variants."""
    return {"kind": row["kind"], "dtype": row["dtype"], "layout": row["layout"], "tf32": row.get("tf32", False),
            "batch": row["batch"], "in_channels": row["in_channels"], "hw": row["hw"],
            "out_channels": row["out_channels"], "kernel": row["kernel"], "stride": row["stride"],
            "groups": row["groups"], "time_s": row["time_s"]}


def kernel_bench_changes(doc: dict[str, Any], gpu: GPU, profile: DeviceProfile) -> dict[str, Any]:
    """The profile fields the kernel bench measures (module docstring), as ``DeviceProfile``
    keyword changes on top of ``profile``; fields without informative rows are left out."""
    from nnperf.measure.calibration.profile import depthwise_rates, low_channel_efficiency

    rows = doc.get("rows", [])
    changes: dict[str, Any] = {}
    cycles = loop_cycles(rows, gpu, profile)
    if cycles:
        changes["loop_iteration_cycles"] = cycles
        cudnn = loop_cycles(rows, gpu, profile, library=CUDNN)
        if cudnn:
            changes["cudnn_batch_norm_loop_fraction"] = cudnn / cycles
    forward = [r for r in rows if r.get("pass") == "forward"]
    scratch = Calibration(device=doc.get("device", "cuda"), device_name=gpu.name, quick=bool(doc.get("quick")),
                          date="", torch_version="", threads=1, timing=TIMING_DEVICE, complete=True)
    scratch.conv_variants = [_as_variant(r) for r in _timed(forward, "depthwise")]
    depthwise = depthwise_rates(scratch, gpu)
    if depthwise:
        changes["depthwise_rate"] = {**profile.depthwise_rate, **depthwise}
    scratch.conv_variants = [_as_variant(r) for r in _timed(forward, "stem") if r["layout"] == "nchw"]
    stem = low_channel_efficiency(scratch, gpu, profile)
    if stem:
        changes["conv_efficiency"] = {**profile.conv_efficiency, "low_channel_forward": stem}
    return changes
