"""Efficiency constants of the time models, as data: generic defaults or a measured profile.

Every constant a time model uses lives in a ``DeviceProfile`` so that calibration can replace
it without code changes. Defaults come from ``default_profile.toml`` (each number commented
with its origin), optionally refined per architecture.

Profile file format (TOML; ``save_profile`` writes it, ``load_profile`` reads it)::

    gpu = "h200-sxm"                 # optional: which GPU it was measured on
    note = "measured 2025-06-01 ..." # optional free text
    gemm_peak_fraction = 0.79        # any scalar field of DeviceProfile
    bandwidth_fraction = 0.9
    kernel_overhead_s = 3e-06
    ...
    # measured curves, interpolated log-linearly (linear in log x), clamped at the ends:
    bandwidth_curve = [[4096, 1.1e9], [1048576, 1.2e12], [1073741824, 4.3e12]]  # bytes, B/s
    [gemm_efficiency]                # dtype -> [[flops, fraction of the unit's peak], ...]
    bf16 = [[1e9, 0.2], [1e12, 0.78]]
    [tile_relative_efficiency]       # "TmxTn" -> relative efficiency (also the candidate set)
    "256x128" = 1.0
    [ctas_per_sm]                    # "TmxTn" -> CTAs resident per SM (default 1)
    [alignment_penalty]              # "16B" / "128B" -> efficiency factor; "16B.bf16": one dtype's
    [conv_efficiency]                # convolution class (CONV_CLASSES) -> speed relative to a
                                     # cuBLAS GEMM of its implicit-GEMM shape
    [measured]                       # optional, ignored by the models: calibration's headline
                                     # figures (written by `nnperf calibrate`)

A field left out keeps its generic default. ``bandwidth_curve`` replaces
``bandwidth_fraction``/``bandwidth_half_bytes``; a ``gemm_efficiency`` curve for a dtype
replaces ``gemm_peak_fraction`` (or ``cuda_core_fraction``) for that dtype: it should hold the
fraction reached by aligned, wave-friendly GEMMs of that size, since tile and wave quantization
are still modelled on top.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nnperf.errors import UsageError, shown
from nnperf.hardware import schema

if TYPE_CHECKING:
    from nnperf.hardware.catalog import GPU

DEFAULTS_FILE = Path(__file__).parent / "default_profile.toml"
Curve = tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class DeviceProfile:
    """How close to its datasheet a GPU gets, and what every kernel and op costs on top.

    See ``default_profile.toml`` for the meaning and origin of each default value.
    """

    gemm_peak_fraction: float = 0.82
    # Tensor units at most ``low_rate_flops_per_clock_sm`` dense FLOP per clock per SM (GeForce
    # fp32-accumulate, TF32 on GA10x/AD10x) are fed more easily: they reach this fraction instead.
    low_rate_tensor_fraction: float = 0.98
    low_rate_flops_per_clock_sm: float = 512.0
    cuda_core_fraction: float = 0.9
    bandwidth_fraction: float = 0.88
    bandwidth_half_bytes: float = 2 * 2**20
    kernel_overhead_s: float = 3e-6
    host_dispatch_s: float = 1e-5
    split_k_max: int = 16
    split_k_min_k: int = 256
    attention_forward_fraction: float = 0.5
    attention_backward_fraction: float = 0.4
    efficient_attention_forward_scale: float = 1.0
    efficient_attention_backward_scale: float = 1.0
    flex_attention_forward_scale: float = 1.0
    flex_attention_backward_scale: float = 1.0
    # cuDNN's fused attention (SDPA's cuDNN backend, Transformer Engine's fused attention)
    # against flash's fraction, per pass (``kernels.attention``: chosen with ``--sdpa cudnn``)
    cudnn_attention_forward_scale: float = 1.0
    cudnn_attention_backward_scale: float = 1.0
    # cuDNN convolutions relative to a cuBLAS GEMM of their implicit-GEMM shape, per class of
    # ``conv_efficiency_class``; a class left out is 1. ``conv_efficiency_scale`` multiplies
    # every class (``nnperf calibrate`` measures it).
    conv_efficiency: Mapping[str, float] = field(default_factory=dict, hash=False)
    conv_efficiency_scale: float = 1.0
    host_view_s: float = 2e-6
    # The parts of an eager step's host time beside each op's dispatch (``passes.host_time``;
    # ``measure.calibration.host_parts`` measures each): what a call from Python adds over the
    # same op dispatched from C++; what recording an autograd node adds to an op and to a view;
    # an ``nn.Module`` call and each of its forward hooks; an op inside autocast; the backward
    # engine per node and per ``backward()`` call; ``zero_grad`` per parameter; ``.item()``'s round trip to the device; a
    # kernel-launching op in a stream of different ops over its tight loop's cost.
    host_python_call_s: float = 1e-6
    host_autograd_record_s: float = 1e-6
    host_view_autograd_s: float = 7e-7
    host_module_call_s: float = 1.3e-6
    host_module_hook_s: float = 2e-6
    host_autocast_op_s: float = 2e-7
    host_backward_node_s: float = 4e-6
    host_backward_call_s: float = 0.0
    host_zero_grad_param_s: float = 3e-7
    host_sync_s: float = 1.5e-5
    host_in_context: float = 1.0
    # One optimizer.step() on the host per "optimizer/implementation" (adamw/foreach,
    # sgd-momentum/fused, ...): a fixed part and a part per parameter. An implementation
    # left out has its ops priced one by one.
    host_optimizer_step_s: Mapping[str, float] = field(default_factory=dict, hash=False)
    host_optimizer_param_s: Mapping[str, float] = field(default_factory=dict, hash=False)
    # What a DTensor (tensor-subclass) dispatch adds on the host to the op beneath it, and each
    # tensor of a list argument beyond the first (a foreach step on sharded parameters).
    host_dtensor_dispatch_s: float = 0.0
    host_dtensor_list_tensor_s: float = 0.0
    foreach_tensors_per_kernel: float = 48.0
    # SM cycles of one iteration of a latency-bound per-thread loop (``kernels.native_loops``:
    # PyTorch's NCHW batch norm, max pooling, depthwise weight gradient): one memory round trip.
    loop_iteration_cycles: float = 600.0
    # cuDNN's NCHW batch-norm training kernels are loops too (one block per channel), with a
    # shorter round trip per iteration than PyTorch's one-scalar-load loops: its cycles over
    # ``loop_iteration_cycles`` (``kernels.batch_norm``).
    cudnn_batch_norm_loop_fraction: float = 1.0
    # Bytes per SM and boost clock (read and written) of cuDNN's NCHW <-> NHWC conversions
    # around a tensor-core convolution (``passes.timing.transpose_time``); 0: not measured, at
    # the achievable DRAM bandwidth.
    layout_transpose_bytes_per_clock_sm: float = 0.0
    # The single-core clock (GHz, datasheet max turbo) of the host the host_* costs describe:
    # ``hardware.host.with_host`` rescales them to another CPU by the ratio of clocks.
    host_turbo_ghz: float = 3.5
    host: str = ""
    # Dispatch cost per op category of an op called from Python (a category missing uses
    # host_dispatch_s); from C++ (backward, autocast's casts) less host_python_call_s.
    host_dispatch_by_kind_s: Mapping[str, float] = field(default_factory=dict, hash=False)
    tile_relative_efficiency: Mapping[str, float] = field(default_factory=dict, hash=False)
    ctas_per_sm: Mapping[str, int] = field(default_factory=dict, hash=False)
    alignment_penalty: Mapping[str, float] = field(default_factory=dict, hash=False)
    # A fused attention kernel's rate at query/key head dims above ``WIDE_HEAD_DIM`` (latent
    # attention's 192) over its rate at 128, per kernel and pass (``WIDE_HEAD_KERNELS``); one
    # left out is 1.
    wide_head_attention: Mapping[str, float] = field(default_factory=dict, hash=False)
    bandwidth_curve: Curve | None = None
    gemm_efficiency: Mapping[str, Curve] = field(default_factory=dict, hash=False)
    # The tensor cores' achievable fraction for a dtype whose measurement differs from
    # ``gemm_peak_fraction``'s (FP8 on Hopper), dtype -> fraction; a dtype left out takes it.
    gemm_peak_fraction_by_dtype: Mapping[str, float] = field(default_factory=dict, hash=False)
    # Depthwise convolutions' tap loops (``kernels.depthwise``): per kernel family and dtype
    # (``DEPTHWISE_RATE_KEYS``), [[taps per output (R*S), MACs per SM per clock], ...].
    depthwise_rate: Mapping[str, Curve] = field(default_factory=dict, hash=False)
    gpu: str | None = None
    note: str = ""
    # Parts of the host model (``HOST_PARTS``) a profile that measured its host's dispatch
    # did not measure: they are the shipped defaults', which describe another host.
    unmeasured_host_parts: tuple[str, ...] = ()

    # ---- what the models ask -----------------------------------------------------------
    def tiles(self) -> list[tuple[int, int]]:
        """Candidate CTA tiles (Tm, Tn), most efficient first."""
        items = sorted(self.tile_relative_efficiency.items(), key=lambda kv: -kv[1])
        return [_parse_tile(name) for name, _ in items]

    def tile_efficiency(self, tile: tuple[int, int]) -> float:
        return self.tile_relative_efficiency.get(_tile_name(tile), 1.0)

    def tile_ctas_per_sm(self, tile: tuple[int, int]) -> int:
        return int(self.ctas_per_sm.get(_tile_name(tile), 1))

    def math_fraction(self, unit: str, dtype: str, flops: float,
                      flops_per_clock_sm: float | None = None) -> float:
        """Achievable fraction of the unit's peak: measured curve if any, else the constant.

        ``flops_per_clock_sm`` is the unit's datasheet rate per SM and clock: a tensor pipe at
        half or less of the rate the SM's operand delivery was built for stalls less
        (``low_rate_tensor_fraction``)."""
        curve = self.gemm_efficiency.get(dtype)
        if curve:
            return min(1.0, interpolate(curve, flops))
        if unit != "tensor":
            return self.cuda_core_fraction
        if dtype in self.gemm_peak_fraction_by_dtype:
            return self.gemm_peak_fraction_by_dtype[dtype]
        if flops_per_clock_sm is not None and flops_per_clock_sm <= self.low_rate_flops_per_clock_sm * 1.01:
            return self.low_rate_tensor_fraction
        return self.gemm_peak_fraction

    def attention_head_scale(self, backend: str, backward: bool, head_dim: int) -> float:
        """The share of its head-dim-128 rate the ``backend`` kernel's pass reaches at query/key
        head dim ``head_dim`` (``wide_head_attention``): 1 up to ``WIDE_HEAD_DIM``. Wider heads
        leave a tile fewer registers, so the kernels fall back to smaller or generic tiles."""
        if head_dim <= WIDE_HEAD_DIM:
            return 1.0
        return self.wide_head_attention.get(f"{backend}_{'backward' if backward else 'forward'}", 1.0)

    def conv_efficiency_of(self, stride: int, positions: int, role: str, unit: str = "tensor",
                           channel_bytes: int | None = None) -> float:
        """A convolution pass's speed relative to a cuBLAS GEMM of its implicit-GEMM shape
        (``conv_efficiency_class`` for the arguments): its class's value times the scale."""
        key = conv_efficiency_class(stride, positions, role, unit, channel_bytes)
        if key not in self.conv_efficiency and key == "low_channel_forward":  # not measured here
            key = conv_efficiency_class(stride, positions, role, unit)
        return self.conv_efficiency.get(key, 1.0) * self.conv_efficiency_scale

    def achievable_bandwidth(self, peak_bytes_per_s: float, nbytes: float) -> float:
        """Bytes/s a kernel moving ``nbytes`` reaches (small transfers reach less)."""
        if self.bandwidth_curve:
            return min(peak_bytes_per_s, interpolate(self.bandwidth_curve, nbytes))
        big = peak_bytes_per_s * self.bandwidth_fraction
        return big * nbytes / (nbytes + self.bandwidth_half_bytes)

    def memory_time(self, peak_bytes_per_s: float, nbytes: float) -> float:
        """Seconds to move ``nbytes`` through DRAM (0 for nothing)."""
        if nbytes <= 0:
            return 0.0
        return nbytes / self.achievable_bandwidth(peak_bytes_per_s, nbytes)

    @property
    def host_label(self) -> str:
        """The host CPU as a table header names it: the shipped defaults' ``cloud-vm`` (the
        virtual machine a rented GPU comes with), the ``--host`` id, or the CPU a calibration
        measured; '' for a profile that names none."""
        return f"host {self.host}" if self.host else ""

    def host_json(self) -> dict[str, Any]:
        """The host the host costs describe, for a JSON document: its name (``cloud-vm`` for the
        shipped defaults; null where a profile names none) and its single-core clock."""
        return {"host": self.host or None, "host_turbo_ghz": self.host_turbo_ghz,
                "host_notes": list(self.host_notes)}

    @property
    def host_notes(self) -> tuple[str, ...]:
        """What a reader of the prediction must know about the host costs (never a silent
        default): which parts came from the shipped defaults instead of this host."""
        if not self.unmeasured_host_parts:
            return ()
        parts = ", ".join(f.removeprefix("host_") for f in self.unmeasured_host_parts)
        return (f"the profile measured this host's op dispatch but not {parts}: those are the defaults' "
                "(default_profile.toml: the cloud VM's); nnperf calibrate on the GPU's own host measures them",)

    def replace(self, **changes: Any) -> DeviceProfile:
        return dataclasses.replace(self, **changes)


#: The passes of a convolution, as ``passes.gemms`` names the roles of its implicit GEMMs.
CONV_PASSES = ("forward", "grad_input", "grad_weight")
#: Output positions per image (P*Q) from which a convolution counts as large: 14x14.
CONV_LARGE_POSITIONS = 196
#: The classes of ``conv_efficiency`` (``conv_efficiency_class``): stride-1 convolutions with
#: large outputs in every pass; the others (strided or small outputs) per pass; convolutions on
#: CUDA cores, whatever their shape.
CONV_CLASSES = ("stride1_large", "other_forward", "other_grad_input", "other_grad_weight", "cuda_core",
                "low_channel_forward")
#: Input channels (per group) x element size below which a tensor-core convolution's forward
#: pass is a ``low_channel_forward``: fewer than one 16-byte vector of channels per pixel (an RGB
#: stem), which cuDNN's NHWC implicit-GEMM kernels load and pad element by element.
LOW_CHANNEL_BYTES = 16


def conv_efficiency_class(stride: int, positions: int, role: str, unit: str = "tensor",
                          channel_bytes: int | None = None) -> str:
    """The ``conv_efficiency`` class of a convolution pass: its largest stride, its output
    positions per image (P*Q; a backward pass: its output gradient's), the role of its implicit
    GEMM (``grad_input``, ``grad_weight``; anything else is a forward), the math unit it runs
    on and, for a forward pass, its input channels per group times the element size. Why
    these: the DeepBench derivation in ``default_profile.toml`` (the low-channel class: the
    H200 calibration's RGB stem)."""
    if unit != "tensor":
        return "cuda_core"
    if role not in ("grad_input", "grad_weight") and channel_bytes is not None and channel_bytes < LOW_CHANNEL_BYTES:
        return "low_channel_forward"
    if stride <= 1 and positions >= CONV_LARGE_POSITIONS:
        return "stride1_large"
    return f"other_{role if role in CONV_PASSES else 'forward'}"


def interpolate(curve: Sequence[tuple[float, float]], x: float) -> float:
    """Linear in log(x) between measured points; clamped to the first/last value outside."""
    points = sorted(curve)
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x <= x1:
            t = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return y0 + t * (y1 - y0)
    return points[-1][1]


def _tile_name(tile: tuple[int, int]) -> str:
    return f"{tile[0]}x{tile[1]}"


def _parse_tile(name: str) -> tuple[int, int]:
    side = schema.PROFILE_RANGES["tile_side"]
    try:
        tm, tn = (int(v) for v in name.lower().split("x"))
    except ValueError:
        tm = tn = 0
    if not (side.admits(tm) and side.admits(tn)):
        raise UsageError(
            f"bad tile name {shown(name)}; expected 'TmxTn' such as '128x256', each side "
            f"{side.describe()}"
        )
    return tm, tn


# ---- reading and writing --------------------------------------------------------------
_SCALARS = {
    f.name: f.type
    for f in dataclasses.fields(DeviceProfile)
    if f.name
    not in {
        "tile_relative_efficiency",
        "ctas_per_sm",
        "alignment_penalty",
        "bandwidth_curve",
        "gemm_efficiency",
        "depthwise_rate",
        "host_dispatch_by_kind_s",
        "conv_efficiency",
        "wide_head_attention",
        "gemm_peak_fraction_by_dtype",
        "host_optimizer_step_s",
        "host_optimizer_param_s",
        "unmeasured_host_parts",
    }
}
_TABLES = ("tile_relative_efficiency", "ctas_per_sm", "alignment_penalty", "host_dispatch_by_kind_s",
           "conv_efficiency", "wide_head_attention", "gemm_peak_fraction_by_dtype", "host_optimizer_step_s", "host_optimizer_param_s")
#: Fields of older profiles that the host model no longer reads: a backward or optimizer op's
#: share of a forward op's cost (``passes.host_time`` prices their parts instead). Accepted and
#: left unused, so a profile calibrated before stays loadable.
_RETIRED = ("host_dispatch_backward_s", "host_dispatch_optimizer_s")
#: The optimizer steps ``host_optimizer_*`` may name: "optimizer/implementation".
HOST_OPTIMIZERS = tuple(f"{o}/{i}" for o in ("adamw", "sgd-momentum") for i in ("single", "foreach", "fused"))
#: The op categories a host dispatch cost may be given for (``host_dispatch_by_kind_s``).
HOST_KINDS = ("gemm", "conv", "attention", "elementwise", "reduction", "norm", "memory", "optimizer")
#: The widest query/key head dim the attention fractions describe (the measured kernels' 128).
WIDE_HEAD_DIM = 128
#: The kernels and passes ``wide_head_attention`` may name (``kernels.attention`` backends).
WIDE_HEAD_KERNELS = ("efficient_forward", "efficient_backward", "flex_forward", "flex_backward")
#: The kernel families of ``depthwise_rate`` (``kernels.depthwise.RATE_KEYS``): PyTorch's
#: direct NCHW kernels or cuDNN's, 16-bit or 32-bit.
DEPTHWISE_RATE_KEYS = ("native_bf16", "native_fp32", "cudnn_bf16", "cudnn_fp32")
#: The alignment classes the GEMM model asks about (``kernels/gemm.py``).
ALIGNMENT_CLASSES = ("16B", "128B")
#: The sections of the shipped ``default_profile.toml``: generic values and per-architecture
#: refinements. A copy of that file is a valid ``--profile`` too.
_SECTIONS = ("default", "architecture")


def _number(here: str, value: Any, valid: schema.Range) -> Any:
    """``value`` if ``valid`` admits it, else a usage error naming the field and the range."""
    if not valid.admits(value):
        raise UsageError(f"{here} is {shown(value)}; expected {valid.describe()}")
    return value


def _curve(where: str, value: Any, x: str, y: str) -> Curve:
    """A measured curve: [[x, y], ...] pairs, each number in its range."""
    x_range, y_range = schema.PROFILE_RANGES[x], schema.PROFILE_RANGES[y]
    pairs = value if isinstance(value, list) and value else None
    if pairs is None or not all(isinstance(p, list) and len(p) == 2 for p in pairs):
        raise UsageError(f"{where}: expected a non-empty list of [x, y] pairs of numbers")
    for px, py in pairs:
        _number(f"{where}: x", px, x_range)
        _number(f"{where}: y", py, y_range)
    return tuple((float(a), float(b)) for a, b in pairs)


def _apply(base: dict[str, Any], table: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Merge a raw TOML table onto profile keyword arguments, checking every value against
    its range in ``schema.PROFILE_RANGES``."""
    out = dict(base)
    # the one efficient-attention share of older profiles first: a per-pass field beside it wins
    for key, value in sorted(table.items(), key=lambda item: item[0] != "efficient_attention_scale"):
        here = f"{where}: field '{key}'"
        if key in ("gpu", "note", "host"):
            if not isinstance(value, str):
                raise UsageError(f"{here} is {shown(value)}; expected a string")
            out[key] = value
        elif key in _SCALARS:
            out[key] = _number(here, value, schema.PROFILE_RANGES[key])
            if not key.startswith("split_k"):
                out[key] = float(value)
        elif key in _TABLES:
            if not isinstance(value, dict):
                raise UsageError(f"{here} must be a table")
            for name, v in value.items():
                if key == "alignment_penalty":
                    per_dtype = name.startswith("16B.") and name[4:] in schema.COMPUTE_DTYPES
                    if name not in ALIGNMENT_CLASSES and not per_dtype:
                        raise UsageError(f"{here}: unknown alignment class {shown(name)}; "
                                         f"valid: {', '.join(ALIGNMENT_CLASSES)}, or 16B.<dtype> "
                                         f"({', '.join(schema.COMPUTE_DTYPES)})")
                elif key == "host_dispatch_by_kind_s":
                    if name not in HOST_KINDS:
                        raise UsageError(f"{here}: unknown op category {shown(name)}; "
                                         f"valid: {', '.join(HOST_KINDS)}")
                elif key == "conv_efficiency":
                    if name not in CONV_CLASSES:
                        raise UsageError(f"{here}: unknown convolution class {shown(name)}; "
                                         f"valid: {', '.join(CONV_CLASSES)}")
                elif key in ("host_optimizer_step_s", "host_optimizer_param_s"):
                    if name not in HOST_OPTIMIZERS:
                        raise UsageError(f"{here}: unknown optimizer step {shown(name)}; "
                                         f"valid: {', '.join(HOST_OPTIMIZERS)}")
                elif key == "wide_head_attention":
                    if name not in WIDE_HEAD_KERNELS:
                        raise UsageError(f"{here}: unknown kernel pass {shown(name)}; "
                                         f"valid: {', '.join(WIDE_HEAD_KERNELS)}")
                elif key == "gemm_peak_fraction_by_dtype":
                    if name not in schema.COMPUTE_DTYPES:
                        raise UsageError(f"{here}: unknown dtype {shown(name)}; "
                                         f"valid: {', '.join(schema.COMPUTE_DTYPES)}")
                else:
                    _parse_tile(name)
                _number(f"{here}.{name}", v, schema.PROFILE_RANGES[key])
            merged = dict(out.get(key, {}))
            merged.update(value)
            out[key] = merged
        elif key == "efficient_attention_scale":  # one share for both passes, as profiles had it
            share = float(_number(here, value, schema.PROFILE_RANGES[key]))
            out["efficient_attention_forward_scale"] = out["efficient_attention_backward_scale"] = share
        elif key == "bandwidth_curve":
            out[key] = _curve(here, value, "bandwidth_curve.bytes", "bandwidth_curve.bytes_per_s")
        elif key == "measured":
            continue  # headline figures written by `nnperf calibrate`, for display only
        elif key in _RETIRED:
            _number(here, value, schema.PROFILE_RANGES["host_dispatch_s"])
        elif key == "depthwise_rate":
            if not isinstance(value, dict):
                raise UsageError(f"{here} must be a table of kind = [[taps, MACs per SM per clock], ...]")
            unknown = sorted(set(value) - set(DEPTHWISE_RATE_KEYS))
            if unknown:
                raise UsageError(f"{here}: unknown kernel family {shown(unknown[0])}; valid: "
                                 f"{', '.join(DEPTHWISE_RATE_KEYS)}")
            merged = dict(out.get(key, {}))
            merged.update({k: _curve(f"{here}.{k}", c, "depthwise_rate.taps", "depthwise_rate.macs")
                           for k, c in value.items()})
            out[key] = merged
        elif key == "gemm_efficiency":
            if not isinstance(value, dict):
                raise UsageError(f"{here} must be a table of dtype = [[flops, fraction], ...]")
            unknown = sorted(set(value) - set(schema.COMPUTE_DTYPES))
            if unknown:
                raise UsageError(f"{here}: unknown dtype {shown(unknown[0])}; valid dtypes: "
                                 f"{', '.join(schema.COMPUTE_DTYPES)}")
            out[key] = {d: _curve(f"{here}.{d}", c, "gemm_efficiency.flops", "gemm_efficiency.fraction")
                        for d, c in value.items()}
        else:
            valid = [*_SCALARS, *_TABLES, "bandwidth_curve", "gemm_efficiency", "depthwise_rate", "measured",
                     "efficient_attention_scale"]
            raise UsageError(f"{where}: unknown field {shown(key)}; valid fields: {', '.join(valid)} "
                             "(or the [default] and [architecture.NAME] tables of default_profile.toml)")
    return out


def _apply_sections(base: dict[str, Any], raw: Mapping[str, Any], where: str, gpu: GPU | None) -> dict[str, Any]:
    """A file in the shipped defaults' layout: ``[default]``, then the ``[architecture.X]``
    table of ``gpu``'s architecture, then any top-level field. Every architecture table is
    checked, not only the one used, so a typo is found on any GPU."""
    kwargs = dict(base)
    default = raw.get("default", {})
    if not isinstance(default, dict):
        raise UsageError(f"{where}: [default] must be a table of profile fields")
    kwargs = _apply(kwargs, default, f"{where} [default]")
    archs = raw.get("architecture", {})
    if not isinstance(archs, dict) or not all(isinstance(t, dict) for t in archs.values()):
        raise UsageError(f"{where}: [architecture] must hold tables such as [architecture.hopper]")
    chosen = kwargs
    for name, table in archs.items():
        applied = _apply(kwargs, table, f"{where} [architecture.{name}]")
        if gpu is not None and name == gpu.architecture.lower():
            chosen = applied
    kwargs = chosen
    rest = {k: v for k, v in raw.items() if k not in _SECTIONS}
    return _apply(kwargs, rest, where)


def default_profile(gpu: GPU | None = None) -> DeviceProfile:
    """Generic constants, refined by the ``[architecture.<name>]`` table for ``gpu``'s family."""
    raw = schema.read_toml(DEFAULTS_FILE, "profile file")
    kwargs = _apply_sections({}, raw, str(DEFAULTS_FILE), gpu)
    if gpu is not None:
        kwargs["gpu"] = gpu.id
    return DeviceProfile(**kwargs)


def load_profile(path: str | Path, gpu: GPU | None = None) -> DeviceProfile:
    """Read a profile file; fields it leaves out keep the generic default (for ``gpu``).

    A file in the layout of the shipped ``default_profile.toml`` (``[default]`` and
    ``[architecture.NAME]`` tables) is read the way the defaults are."""
    base = dataclasses.asdict(default_profile(gpu))
    raw = schema.read_toml(Path(path), "profile file")
    where = f"profile file {shown(path)}"
    if any(k in raw for k in _SECTIONS):
        return DeviceProfile(**_apply_sections(base, raw, where, gpu))
    return DeviceProfile(**{**_apply(base, raw, where), "unmeasured_host_parts": unmeasured_host_parts(raw)})


#: The parts of the host model beside each op's dispatch (``passes.host_time``).
HOST_PARTS = ("host_python_call_s", "host_autograd_record_s", "host_view_autograd_s", "host_module_call_s",
              "host_module_hook_s", "host_autocast_op_s", "host_backward_node_s", "host_backward_call_s",
              "host_zero_grad_param_s", "host_sync_s", "host_in_context")


def unmeasured_host_parts(measured: Mapping[str, Any]) -> tuple[str, ...]:
    """The parts of the host model (``HOST_PARTS``) a profile lacks although it measured its
    host's dispatch cost (``host_dispatch_s``): calibrated before those parts were measured."""
    if "host_dispatch_s" not in measured:
        return ()
    return tuple(f for f in HOST_PARTS if f not in measured)


def _toml_value(value: Any) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} to TOML")


def save_profile(profile: DeviceProfile, path: str | Path) -> None:
    """Write a profile in the format ``load_profile`` reads (see the module docstring)."""
    lines = ["# nnperf device profile (read by nnperf.hardware.profile.load_profile)"]
    for name in _SCALARS:
        value = getattr(profile, name)
        if name in profile.unmeasured_host_parts:
            continue  # left out, so the profile read back says it did not measure them
        if value is not None and value != "":
            lines.append(f"{name} = {_toml_value(value)}")
    if profile.bandwidth_curve:
        lines.append(f"bandwidth_curve = {_toml_value(profile.bandwidth_curve)}")
    tables = {t: getattr(profile, t) for t in _TABLES} | {
        "gemm_efficiency": profile.gemm_efficiency, "depthwise_rate": profile.depthwise_rate,
    }
    for table, values in tables.items():
        lines += ["", f"[{table}]"]
        lines += [f"{_toml_value(k)} = {_toml_value(v)}" for k, v in values.items()]
    Path(path).write_text("\n".join(lines) + "\n")
