"""From measurements to a ``DeviceProfile`` (and, on a CPU, a device description in the GPU
catalog schema, so the same time model can predict CPU steps)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from nnperf.hardware import GPU, DeviceProfile, default_profile
from nnperf.hardware.profile import (
    LOW_CHANNEL_BYTES,
    WIDE_HEAD_DIM,
    WIDE_HEAD_KERNELS,
    Curve,
    interpolate,
    unmeasured_host_parts,
)
from nnperf.measure.calibration.record import TIMING_HOST_EXPOSED, Calibration
from nnperf.measure.device import cpu_name
from nnperf.measure.stats import Spread

#: Host dispatch is charged to the op itself on a CPU (see the package docstring): ~0 here.
CPU_HOST_DISPATCH_S = 1e-9


def peak_for_fraction(cal: Calibration, dtype: str, gpu: GPU | None) -> float | None:
    """The peak a GEMM efficiency curve is a fraction of: the datasheet on a GPU (the model
    multiplies the curve by the catalog peak), the best measured rate on a CPU."""
    if gpu is not None:
        try:
            if dtype == "tf32":
                return gpu.peak("tf32").flops
            return gpu.matmul_peak(dtype).flops
        except Exception:  # the GPU has no unit for this dtype: no curve for it
            return None
    return cal.best_gemm_flops(dtype)


def build_profile(cal: Calibration, gpu: GPU | None, kernel_bench: dict[str, Any] | None = None) -> DeviceProfile:
    """A ``DeviceProfile`` from measurements; ``gpu`` None means a CPU calibration.
    ``kernel_bench``: a ``validation/kernel_bench.py`` document whose rows set the kernel
    constants it measures (``kernel_bench.kernel_bench_changes``), on a GPU.

    Its microbenchmarks are short bursts, which run at the boost clock, not the sustained one
    a GPU entry may state (``sustained_clock_mhz``, what a long load holds): their rates are
    read as fractions of the datasheet peak, and the prediction applies the sustained clock on
    top, as it does to the default fractions."""
    if gpu is not None and gpu.sustained_clock_mhz:
        gpu = dataclasses.replace(gpu, sustained_clock_mhz=None)
    base = default_profile(gpu)
    changes: dict[str, Any] = {}
    curves = {}
    for dtype in dict.fromkeys(g["dtype"] for g in cal.gemm):
        peak = peak_for_fraction(cal, dtype, gpu)
        if not peak:
            continue
        points = gemm_rates(cal, dtype)
        if points:
            curves[dtype] = tuple((f, min(1.0, max(1e-4, r / peak))) for f, r in points)
    if curves:
        changes["gemm_efficiency"] = curves
    copy = copy_rates(cal, base, gpu)
    if copy:
        changes["bandwidth_curve"] = tuple(copy)
    host = cal.overhead.get("host_per_op_s", {}).get("median")
    view = cal.overhead.get("view_per_op_s", {}).get("median")
    if gpu is None:
        if host:
            changes["kernel_overhead_s"] = host
        changes["host_dispatch_s"] = CPU_HOST_DISPATCH_S
        # the parts of a step's host work run in series with a CPU's kernels, which the
        # measured op costs already hold: none charged beside them
        changes.update(dict.fromkeys(HOST_PART_FIELDS.values(), 0.0))
        changes["host_in_context"] = 1.0
        # DTensor's host work would run serially with the ops on a CPU; not modelled there
        changes["host_dtensor_dispatch_s"] = changes["host_dtensor_list_tensor_s"] = 0.0
        if view:
            changes["host_view_s"] = view
        changes["tile_relative_efficiency"] = {**base.tile_relative_efficiency, "8x8": 1.0}
    else:
        device_kernel = cal.overhead.get("device_per_kernel_s", {}).get("median")
        if device_kernel:
            changes["kernel_overhead_s"] = device_kernel
        if host:
            changes["host_dispatch_s"] = host
        parts = host_part_fields(cal)
        changes.update(parts)
        if host:
            changes["unmeasured_host_parts"] = unmeasured_host_parts({"host_dispatch_s": host, **parts})
        if view:
            changes["host_view_s"] = view
        by_kind = host_costs_by_category(cal)
        conv = (cal.host_parts or {}).get("parts", {}).get("conv_op_s")
        if conv:  # a cuDNN convolution's call on this host (host_parts)
            by_kind["conv"] = conv
        if by_kind:  # a category it did not measure keeps the default's, as in the saved file
            changes["host_dispatch_by_kind_s"] = {**base.host_dispatch_by_kind_s, **by_kind}
        dtensor = cal.overhead.get("dtensor") or {}
        if dtensor:
            changes["host_dtensor_dispatch_s"] = max(0.0, dtensor["dispatch_s"]["median"])
            changes["host_dtensor_list_tensor_s"] = max(0.0, dtensor["list_tensor_s"]["median"])
    if cal.host_max_ghz:
        changes["host_turbo_ghz"] = cal.host_max_ghz
    if cal.host_cpu:
        changes["host"] = cal.host_cpu
    conv = conv_efficiency_scale(cal, gpu, base, base.replace(gemm_efficiency=curves) if curves else base)
    if conv:
        changes["conv_efficiency_scale"] = conv
    if gpu is not None:
        changes.update(attention_fractions(cal, gpu))
        if "wide_head_attention" in changes:  # passes it did not measure keep the default
            changes["wide_head_attention"] = {**base.wide_head_attention, **changes["wide_head_attention"]}
    if gpu is not None:
        transposes = layout_transpose_rate(cal, gpu)
        if transposes:
            changes["layout_transpose_bytes_per_clock_sm"] = transposes
        modeled = dataclasses.replace(base, **{k: v for k, v in changes.items() if k in (
            "gemm_efficiency", "conv_efficiency_scale", "layout_transpose_bytes_per_clock_sm", "kernel_overhead_s")})
        stem = low_channel_efficiency(cal, gpu, modeled)
        if stem:
            changes["conv_efficiency"] = {**base.conv_efficiency, "low_channel_forward": stem}
        depthwise = depthwise_rates(cal, gpu)
        if depthwise:  # families it did not measure keep the default
            changes["depthwise_rate"] = {**base.depthwise_rate, **depthwise}
    misaligned = misaligned_penalty(cal, gpu, base) if gpu is not None else None
    if misaligned:
        changes["alignment_penalty"] = {**base.alignment_penalty, "16B": misaligned,
                                        **misaligned_penalties(cal, gpu, base)}
    note = (
        f"measured by nnperf calibrate{' --quick' if cal.quick else ''} on {cal.device_name} "
        f"({cal.device}), {cal.date}, torch {cal.torch_version}"
    )
    if gpu is not None and kernel_bench is not None:
        from nnperf.measure.calibration.kernel_bench import kernel_bench_changes

        changes.update(kernel_bench_changes(kernel_bench, gpu, dataclasses.replace(base, **changes)))
        note += f"; kernels from kernel-bench ({kernel_bench.get('environment', {}).get('date', 'undated')})"
    return dataclasses.replace(base, gpu=gpu.id if gpu else "cpu", note=note, **changes)


#: How much longer than the host's floor a host-exposed measurement must take to be the
#: device's: below it, the events timed the host's launches (``Calibration.timing``). The
#: device time shows as max(host, device), so the step from the floor is sharp; 1.6x leaves
#: room for a floor that grows with the operands (the copies: 6.6 us at 128 KiB, 9.9 us at
#: 8 MiB on the H200 of 2026-11-28, where a GEMM of 2048^3 took 24.5 us over a 13.4 us floor).
HOST_FLOOR_MARGIN = 1.6


def informative(rows: list[dict[str, Any]], cal: Calibration, floor_s: float | None = None) -> list[dict[str, Any]]:
    """The rows that timed the device: all of a device-timed calibration's; of a host-exposed
    one's, those above ``HOST_FLOOR_MARGIN`` times the floor (``floor_s``, at least the
    fastest row's time: what the host's launch loop alone took)."""
    if cal.timing != TIMING_HOST_EXPOSED or not rows:
        return rows
    floor = max(min(r["time_s"] for r in rows), floor_s or 0.0)
    return [r for r in rows if r["time_s"] > HOST_FLOOR_MARGIN * floor]


def gemm_rates(cal: Calibration, dtype: str) -> list[tuple[float, float]]:
    """(FLOPs, achieved FLOP/s) of the aligned square GEMMs of ``dtype`` that timed the
    device; smaller GEMMs then take the smallest measured one's fraction of peak."""
    every = [g for g in cal.gemm if g["dtype"] == dtype]
    host_mm = (cal.overhead.get("host_per_op_by_kind_s") or {}).get("mm", {}).get("median")
    return sorted((g["flops"], g["flops_per_s"]) for g in informative(every, cal, host_mm) if g["kind"] == "square")


def copy_rates(cal: Calibration, base: DeviceProfile, gpu: GPU | None) -> list[tuple[float, float]]:
    """(bytes moved, bytes/s) of the copies that timed the device; below the smallest, where
    a host-exposed calibration saw only the host, the default ramp (``bandwidth_fraction``,
    ``bandwidth_half_bytes``) of the datasheet bandwidth."""
    every = [b for b in cal.bandwidth if b["kind"] == "copy"]
    kept = sorted((b["bytes_moved"], b["bytes_per_s"]) for b in informative(every, cal))
    dropped = sorted(b["bytes_moved"] for b in every if kept and b["bytes_moved"] < kept[0][0])
    if dropped and gpu is not None:
        kept = [(n, base.achievable_bandwidth(gpu.memory_bandwidth, n)) for n in dropped] + kept
    return kept


#: The op category each dispatch-cost microbenchmark stands for (``plan.DISPATCH_KINDS``).
DISPATCH_CATEGORY = {"add": "elementwise", "mul_": "elementwise", "mm": "gemm", "sum": "reduction",
                     "softmax": "reduction", "layer_norm": "norm", "cat": "memory", "index_select": "memory"}


def attention_fractions(cal: Calibration, gpu: GPU) -> dict[str, Any]:
    """The profile's attention numbers from the SDPA benchmark: flash's forward and backward
    FLOP rates (backward with its recomputed Q@K^T, as the time model counts it) over the bf16
    tensor peak, medians over the shapes; the efficient kernel's forward and backward shares of
    flash (``efficient_attention_*_scale``), the medians of flash's time over the efficient
    kernel's on the same shapes (the same work), cuDNN's likewise (``cudnn_attention_*_scale``);
    and FlexAttention's (``flex_attention_*_scale``)."""
    try:
        peak = gpu.matmul_peak("bf16").flops
    except Exception:  # no bf16 tensor rate: nothing to be a fraction of
        return {}
    timed = [r for r in cal.attention if "forward_s" in r]
    flash = [r for r in timed if r["backend"] == "flash"]
    out: dict[str, float] = {}
    if flash:
        fwd = Spread.of([r["forward_flops"] / r["forward_s"] / peak for r in flash]).median
        bwd = Spread.of([(r["backward_flops"] + r["recompute_flops"]) / r["backward_s"] / peak for r in flash]).median
        out["attention_forward_fraction"] = min(1.0, fwd)
        out["attention_backward_fraction"] = min(1.0, bwd)

    def key(r: dict[str, Any]) -> tuple:
        return r["batch"], r["heads"], r["tokens"], r["head_dim"], r["head_dim_v"]

    flash_by_shape = {key(r): r for r in flash}
    for phase in ("forward", "backward"):
        shares = [flash_by_shape[key(r)][f"{phase}_s"] / r[f"{phase}_s"]
                  for r in timed if r["backend"] == "efficient" and key(r) in flash_by_shape]
        if shares:
            out[f"efficient_attention_{phase}_scale"] = min(1.0, Spread.of(shares).median)
        cudnn_shares = [flash_by_shape[key(r)][f"{phase}_s"] / r[f"{phase}_s"]
                        for r in timed if r["backend"] == "cudnn" and key(r) in flash_by_shape]
        if cudnn_shares:
            out[f"cudnn_attention_{phase}_scale"] = Spread.of(cudnn_shares).median
        # FlexAttention is charged for the pairs of its computed blocks, flash for the kept
        # pairs: its share is flash's time over its own, times the ratio of those pair counts
        flex_shares = [flash_by_shape[key(r)][f"{phase}_s"] / r[f"{phase}_s"] * r["executed_pairs"] / _kept(r)
                       for r in timed if r["backend"] == "flex" and key(r) in flash_by_shape]
        if flex_shares:
            out[f"flex_attention_{phase}_scale"] = Spread.of(flex_shares).median
    wide = wide_head_shares(timed)
    if wide:
        out["wide_head_attention"] = wide
    return out


def wide_head_shares(rows: list[dict[str, Any]]) -> dict[str, float]:
    """``wide_head_attention`` from the benchmark: each kernel pass's FLOP rate at a query/key
    head dim above ``WIDE_HEAD_DIM`` over its rate at that dim on the same batch, heads, tokens,
    value head dim and masking (medians over shapes), for the kernels ``WIDE_HEAD_KERNELS`` names."""
    def rates(r: dict[str, Any]) -> dict[str, float]:
        return {"forward": r["forward_flops"] / r["forward_s"],
                "backward": (r["backward_flops"] + r["recompute_flops"]) / r["backward_s"]}

    def key(r: dict[str, Any]) -> tuple:
        return r["backend"], r["batch"], r["heads"], r["tokens"], r["head_dim_v"], r.get("causal")

    narrow = {key(r): rates(r) for r in rows if r["head_dim"] == WIDE_HEAD_DIM}
    shares: dict[str, list[float]] = {}
    for r in rows:
        base = narrow.get(key(r))
        if r["head_dim"] <= WIDE_HEAD_DIM or base is None:
            continue
        for phase, rate in rates(r).items():
            name = f"{r['backend']}_{phase}"
            if name in WIDE_HEAD_KERNELS:
                shares.setdefault(name, []).append(rate / base[phase])
    return {name: Spread.of(values).median for name, values in shares.items()}


def _kept(row: dict[str, Any]) -> float:
    """The causal pairs of a benchmark row, from its forward FLOPs (two products of q/k and v
    head dims per pair)."""
    return row["forward_flops"] / (2.0 * (row["head_dim"] + row["head_dim_v"]))


#: ``measure.calibration.host_parts`` parts -> the profile field each one sets.
HOST_PART_FIELDS = {
    "python_call_s": "host_python_call_s", "autograd_record_s": "host_autograd_record_s",
    "view_autograd_s": "host_view_autograd_s", "module_call_s": "host_module_call_s",
    "module_hook_s": "host_module_hook_s", "autocast_op_s": "host_autocast_op_s",
    "backward_node_s": "host_backward_node_s", "backward_call_s": "host_backward_call_s",
    "zero_grad_param_s": "host_zero_grad_param_s",
    "sync_s": "host_sync_s",
}


def host_part_fields(cal: Calibration) -> dict[str, Any]:
    """Profile fields from the host-parts measurement (``cal.host_parts``): each part, floored
    at 0 (a difference of two loops that noise made negative adds nothing), the in-context
    ratio (at least 1) and the optimizer steps; parts it lacks keep their defaults."""
    parts = (cal.host_parts or {}).get("parts", {})
    out: dict[str, Any] = {field: max(0.0, parts[part]) for part, field in HOST_PART_FIELDS.items()
                           if parts.get(part) is not None}
    if parts.get("in_context") is not None:
        out["host_in_context"] = max(1.0, parts["in_context"])
    optimizers = (cal.host_parts or {}).get("optimizers", {})
    if optimizers:
        out["host_optimizer_step_s"] = {k: max(0.0, v["step_s"]) for k, v in optimizers.items()}
        out["host_optimizer_param_s"] = {k: max(0.0, v["param_s"]) for k, v in optimizers.items()}
    return out


def host_costs_by_category(cal: Calibration) -> dict[str, float]:
    """Measured host seconds per op, per op category: the median over the kinds measured for
    that category (a GPU calibration: the enqueue cost of one op of the kind)."""
    by_category: dict[str, list[float]] = {}
    for kind, spread in cal.overhead.get("host_per_op_by_kind_s", {}).items():
        category = DISPATCH_CATEGORY.get(kind)
        if category:
            by_category.setdefault(category, []).append(spread["median"])
    return {c: Spread.of(v).median for c, v in by_category.items()}


#: Dtypes whose GEMMs run on tensor cores, where the 16-byte alignment rule applies.
TENSOR_DTYPES = ("fp16", "bf16", "tf32")
#: Sizes from which a misaligned GEMM counts as large (its penalty, not its launch, is measured).
MISALIGNED_MIN_N = 2048


def misaligned_ratios(cal: Calibration, gpu: GPU, base: DeviceProfile) -> dict[str, list[float]]:
    """Per tensor-core dtype, each (n+1)^3 GEMM's rate over the n^3 one's, divided by what the
    model gives that ratio with no alignment penalty (the extra tile row/column of n+1 costs
    time too), for sizes >= ``MISALIGNED_MIN_N``."""
    from nnperf.kernels.gemm import estimate_gemm

    neutral = base.replace(alignment_penalty={k: 1.0 if k.startswith("16B") else v
                                              for k, v in {**base.alignment_penalty, "16B": 1.0}.items()})
    square = {(g["dtype"], g["n"]): g for g in cal.gemm if g["kind"] == "square"}
    ratios: dict[str, list[float]] = {}
    for g in cal.gemm:
        pair = square.get((g["dtype"], g["n"] - 1))
        if g["kind"] != "misaligned" or g["dtype"] not in TENSOR_DTYPES or pair is None or pair["n"] < MISALIGNED_MIN_N:
            continue
        n = pair["n"]
        try:
            modeled = (estimate_gemm(n, n, n, dtype=g["dtype"], gpu=gpu, profile=neutral).time_s
                       / estimate_gemm(n + 1, n + 1, n + 1, dtype=g["dtype"], gpu=gpu, profile=neutral).time_s)
        except Exception:  # the GPU has no unit for this dtype
            continue
        measured = pair["time_s"] / g["time_s"]
        ratios.setdefault(g["dtype"], []).append(min(1.0, max(0.05, measured / modeled)))
    return ratios


def misaligned_penalty(cal: Calibration, gpu: GPU, base: DeviceProfile) -> float | None:
    """The 16-byte alignment penalty the GEMM model should use on this GPU for a dtype without
    its own: the median of ``misaligned_ratios`` over every tensor-core dtype and size; None
    without such pairs."""
    every = [r for ratios in misaligned_ratios(cal, gpu, base).values() for r in ratios]
    return Spread.of(every).median if every else None


def misaligned_penalties(cal: Calibration, gpu: GPU, base: DeviceProfile) -> dict[str, float]:
    """``alignment_penalty`` entries per dtype (``"16B.bf16"``...): each dtype's median of
    ``misaligned_ratios``. cuBLAS's fallback kernels differ by dtype: on the H200 a misaligned
    bf16 or fp16 GEMM kept 0.15-0.20 of the aligned rate, a TF32 one 0.24-0.32."""
    return {f"16B.{dtype}": Spread.of(ratios).median for dtype, ratios in misaligned_ratios(cal, gpu, base).items()}


def conv_efficiency_scale(cal: Calibration, gpu: GPU | None, base: DeviceProfile,
                          gemm_profile: DeviceProfile | None = None) -> float | None:
    """The factor on the profile's ``conv_efficiency`` table that the measured convolutions
    imply. The table says how fast a convolution pass runs against a cuBLAS GEMM of its
    implicit-GEMM shape (M = batch x output positions, N = output channels, K = input channels
    x kernel area), so on a GPU each dense channels_last forward convolution of the variants
    (no layout transposes, which the model charges apart) is set against the GEMM model's
    compute time for that shape (``gemm_profile``: the profile with the measured GEMM curves),
    the term the time model divides by the class's efficiency (``passes.timing``; the GEMM's
    own memory term counts the im2col matrix, which an implicit GEMM never writes): median of
    (modeled compute time / measured time) over the table's value for its class. Where no such
    variant was measured (a CPU, older raw files), each convolution's rate against the GEMM
    rate at its FLOPs stands in. The table's shape (strided, small, backward) stays as derived."""
    ratios = []
    dense = [c for c in cal.conv_variants if c["kind"] == "dense" and c.get("layout") == "channels_last"]
    if gpu is not None and dense:
        from nnperf.kernels.gemm import estimate_gemm

        for c in dense:
            out_hw, dtype = _out_hw(c), c["dtype"]
            try:
                gemm = estimate_gemm(c["batch"] * out_hw * out_hw, c["out_channels"],
                                     c["in_channels"] * c["kernel"] ** 2, dtype=dtype, gpu=gpu,
                                     profile=gemm_profile or base, tf32=bool(c.get("tf32")))
            except Exception:  # the GPU has no unit for this dtype
                continue
            table = (base.conv_efficiency_of(c["stride"], out_hw * out_hw, "forward", _math_unit(gpu, dtype))
                     / base.conv_efficiency_scale)
            ratios.append(gemm.model_compute_s / c["time_s"] / table)
    else:
        for c in cal.conv:
            curve = gemm_rates(cal, c["dtype"])
            if not curve:
                continue
            out_hw = _out_hw(c)
            unit = _math_unit(gpu, c["dtype"])
            table = base.conv_efficiency_of(c["stride"], out_hw * out_hw, "forward", unit) / base.conv_efficiency_scale
            ratios.append(c["flops_per_s"] / interpolate(curve, c["flops"]) / table)
    if not ratios:
        return None
    return min(2.0, max(0.05, Spread.of(ratios).median))


def low_channel_efficiency(cal: Calibration, gpu: GPU, profile: DeviceProfile) -> float | None:
    """``conv_efficiency["low_channel_forward"]`` from the convolutions measured with fewer
    input-channel bytes per pixel than one 16-byte vector (``LOW_CHANNEL_BYTES``: an RGB stem):
    the GEMM model's compute time for the implicit GEMM (``profile``: the measured GEMM curves)
    over the measured time less the NCHW transposes and launches the time model adds around it,
    divided by ``conv_efficiency_scale`` (which multiplies every class); the median over such
    rows, None without one."""
    from nnperf.kernels.gemm import estimate_gemm
    from nnperf.passes.timing import transpose_time

    values = []
    needed = ("dtype", "batch", "in_channels", "hw", "out_channels", "kernel", "stride", "time_s")
    for c in [*cal.conv, *cal.conv_variants]:
        if not all(k in c for k in needed):
            continue  # an older raw file's row without the convolution's shape
        itemsize = 2 if c["dtype"] in ("bf16", "fp16") else 4
        groups = c.get("groups", 1)
        if c["in_channels"] // groups * itemsize >= LOW_CHANNEL_BYTES or c.get("kind") == "depthwise":
            continue
        if c["dtype"] == "fp32" and not c.get("tf32", True):
            continue  # CUDA cores: no tensor-core class
        out_hw = _out_hw(c)
        try:
            gemm = estimate_gemm(c["batch"] * out_hw * out_hw, c["out_channels"] // groups,
                                 c["in_channels"] // groups * c["kernel"] ** 2, batch=groups, dtype=c["dtype"],
                                 gpu=gpu, profile=profile, tf32=bool(c.get("tf32", True)))
        except Exception:  # the GPU has no unit for this dtype
            continue
        kernels, transposed = 1, 0.0
        if c.get("layout", "nchw") == "nchw":
            kernels = 3
            moved = 2 * itemsize * (c["batch"] * c["in_channels"] * c["hw"] ** 2
                                    + c["out_channels"] * c["in_channels"] // groups * c["kernel"] ** 2)
            transposed = transpose_time(moved, gpu, profile)
        own = c["time_s"] - transposed - kernels * profile.kernel_overhead_s
        if own > 0:
            values.append(gemm.model_compute_s / own / profile.conv_efficiency_scale)
    return min(2.0, Spread.of(values).median) if values else None


def layout_transpose_rate(cal: Calibration, gpu: GPU) -> float | None:
    """``layout_transpose_bytes_per_clock_sm`` from the convolution variants measured in both layouts:
    for each tensor-core convolution (dense or grouped, not depthwise or pointwise) timed on
    NCHW and on channels-last tensors of the same shape, dtype and TF32 setting, the bytes
    cuDNN transposes in the forward pass (input and filter, read and written:
    ``passes.costs.matmul.nchw_transposes``) over the extra time, per SM and boost clock; the
    median over pairs. None without a pair (or where NCHW was not slower)."""
    def key(c: dict[str, Any]) -> tuple:
        return c["kind"], c["dtype"], bool(c.get("tf32")), c["batch"], c["in_channels"], c["hw"], \
            c["out_channels"], c["kernel"], c["stride"], c.get("groups", 1)

    rows = [c for c in informative(cal.conv_variants, cal) if c["kind"] in ("dense", "grouped") and c["kernel"] > 1]
    if not any(c["dtype"] != "fp32" or c.get("tf32") for c in rows):
        return None
    last = {key(c): c for c in rows if c.get("layout") == "channels_last"}
    shares = []
    for c in rows:
        pair = last.get(key(c))
        if c.get("layout") != "nchw" or pair is None or (c["dtype"] == "fp32" and not c.get("tf32")):
            continue
        extra = c["time_s"] - pair["time_s"]
        itemsize = 2 if c["dtype"] in ("bf16", "fp16") else 4
        moved = 2 * itemsize * (c["batch"] * c["in_channels"] * c["hw"] ** 2
                                + c["out_channels"] * c["in_channels"] // c.get("groups", 1) * c["kernel"] ** 2)
        if extra > 0:
            shares.append(moved / extra / (gpu.sm_count * gpu.boost_clock_mhz * 1e6))
    return Spread.of(shares).median if shares else None


def depthwise_rates(cal: Calibration, gpu: GPU) -> dict[str, Curve]:
    """``depthwise_rate`` from the depthwise convolution variants that timed the device: per
    kernel family (``kernels.depthwise``: PyTorch's direct NCHW kernels for bf16 and fp32,
    cuDNN's for channels-last and fp16) and kernel area, the median MACs (output elements x
    R*S) per SM per clock at the GPU's boost clock."""
    rows = informative([c for c in cal.conv_variants if c["kind"] == "depthwise"], cal)
    rates: dict[str, dict[int, list[float]]] = {}
    per_second = gpu.sm_count * gpu.boost_clock_mhz * 1e6
    for c in rows:
        path = "cudnn" if c.get("layout") == "channels_last" or c["dtype"] == "fp16" else "native"
        key = f"{path}_{'fp32' if c['dtype'] in ('fp32', 'tf32') else 'bf16'}"
        taps = c["kernel"] ** 2
        macs = c["batch"] * c["out_channels"] * _out_hw(c) ** 2 * taps
        rates.setdefault(key, {}).setdefault(taps, []).append(macs / c["time_s"] / per_second)
    return {key: tuple((float(t), Spread.of(v).median) for t, v in sorted(by_taps.items()))
            for key, by_taps in rates.items()}


def _out_hw(conv: dict[str, Any]) -> int:
    """Output height (= width) of a measured square convolution, padded by half its kernel."""
    return (conv["hw"] + 2 * (conv["kernel"] // 2) - conv["kernel"]) // conv["stride"] + 1


def _math_unit(gpu: GPU | None, dtype: str) -> str:
    """The unit a convolution of ``dtype`` runs on: CUDA cores on a CPU description or where
    the GPU has no tensor rate for the dtype."""
    if gpu is None:
        return "cuda"
    try:
        return gpu.matmul_peak(dtype).unit
    except Exception:  # no unit for this dtype at all
        return "cuda"


def measured_table(cal: Calibration) -> dict[str, Any]:
    """Headline figures for the profile's ``[measured]`` table (shown beside the datasheet)."""
    out: dict[str, Any] = {"device_name": cal.device_name, "date": cal.date, "torch": cal.torch_version,
                           "quick": cal.quick}
    for dtype in dict.fromkeys(g["dtype"] for g in cal.gemm):
        out[f"gemm_best_tflops_{dtype}"] = (cal.best_gemm_flops(dtype) or 0.0) / 1e12
    for kind in ("copy", "elementwise"):
        rates = [b["bytes_per_s"] for b in cal.bandwidth if b["kind"] == kind]
        if rates:
            out[f"{kind}_bandwidth_gbs"] = max(rates) / 1e9
    for key, spread in cal.overhead.items():
        if key == "host_per_op_by_kind_s":
            for kind, one in spread.items():
                out[f"host_{kind}_us"] = one["median"] * 1e6
        elif key == "dtensor":
            out["host_dtensor_dispatch_us"] = spread["dispatch_s"]["median"] * 1e6
            out["host_dtensor_list_tensor_us"] = spread["list_tensor_s"]["median"] * 1e6
        else:
            out[key.replace("_s", "_us")] = spread["median"] * 1e6
    for dtype in dict.fromkeys(g["dtype"] for g in cal.batched_gemm):
        rates = [g["flops_per_s"] for g in cal.batched_gemm if g["dtype"] == dtype]
        out[f"batched_gemm_best_tflops_{dtype}"] = max(rates) / 1e12
    for kind in dict.fromkeys(c["kind"] for c in cal.conv_variants):
        rates = [c["bytes_per_s"] for c in cal.conv_variants if c["kind"] == kind]
        out[f"conv_{kind}_best_gbs"] = max(rates) / 1e9
    for r in (r for r in cal.attention if "forward_s" in r):
        kernel = "flex" if r["backend"] == "flex" else f"sdpa_{r['backend']}"
        tag = f"{kernel}_d{r['head_dim']}_{r['head_dim_v']}_s{r['tokens']}"
        out[f"{tag}_forward_tflops"] = r["forward_flops"] / r["forward_s"] / 1e12
        out[f"{tag}_backward_tflops"] = (r["backward_flops"] + r["recompute_flops"]) / r["backward_s"] / 1e12
    if cal.clock_under_load_mhz:
        out["sm_clock_under_load_mhz"] = cal.clock_under_load_mhz["median"]
    if cal.host_cpu:
        out["host_cpu"] = cal.host_cpu
    for direction in ("h2d", "d2h"):
        for pinned in (False, True):
            rows = [t for t in cal.transfer if t["direction"] == direction and t["pinned"] == pinned]
            if rows:
                tag = f"{direction}_{'pinned' if pinned else 'pageable'}"
                out[f"{tag}_gbs"] = max(r["bytes_per_s"] for r in rows) / 1e9
                out[f"{tag}_latency_us"] = min(r["time_s"] for r in rows) * 1e6
    return out


def cpu_description(cal: Calibration) -> dict[str, Any]:
    """A device description in the GPU catalog schema for this CPU (usable as --gpu-file)."""
    peaks = {d: (cal.best_gemm_flops(d) or 0.0) / 1e12 for d in ("fp32", "bf16", "fp16")}
    mem = _total_memory_bytes()
    return {
        "id": "cpu",
        "name": f"CPU: {cpu_name()} ({cal.threads} threads)",
        "aliases": ["cpu"],
        "vendor": "CPU",
        "architecture": "cpu",
        "confidence": "measured",
        "notes": (
            f"Measured by nnperf calibrate{' --quick' if cal.quick else ''} on {cal.date}: peak rates are "
            "the best GEMM rates measured, bandwidth the best copy bandwidth, sm_count the intra-op threads."
        ),
        "sm_count": max(1, cal.threads),
        "boost_clock_mhz": _cpu_mhz(),
        "memory_gib": mem / 2**30 if mem else 1.0,
        "memory_type": "host DRAM",
        "memory_bandwidth_gbs": (cal.copy_bandwidth() or 1e9) / 1e9,
        "peak_tflops": {"cuda": {d: v for d, v in peaks.items() if v > 0}},
        "sources": {"measurement": f"nnperf calibrate --device cpu, {cal.date}"},
    }


def _total_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _cpu_mhz() -> float:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("cpu MHz"):
                value = float(line.split(":", 1)[1])
                if value > 0:
                    return value
    except (OSError, ValueError):
        pass
    return 1000.0
