"""Pad GEMM dimensions to tensor-core-friendly multiples, per family of dimensions.

NVIDIA's guide: tensor cores need 16-byte aligned M, N, K and A100 and later prefer 128
bytes. A dimension that is not a multiple is padded to the next multiple of 128 bytes of
its math dtype (64 bf16/fp16 elements, as nanoGPT padded 50257 to 50304). The padded GEMMs
are re-timed by the GEMM model (``kernels.gemm``: alignment, tiles, waves), and the padded
FLOPs, the streaming ops over the padded tensors and the padded parameters' memory are
counted, so a padding that costs more than it saves shows as a loss.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from nnperf.hardware import DTYPE_BYTES
from nnperf.passes.costs import registry as cat
from nnperf.search.advise.change import Candidate, Change
from nnperf.search.advise.rewrite import Rewritten
from nnperf.trace.events import OpEvent, TensorMeta

if TYPE_CHECKING:
    from nnperf.analysis import Analysis
    from nnperf.search.advise.evaluate import Base
    from nnperf.search.memory_variants import MemoryOptions
    from nnperf.trace.events import Trace
    from nnperf.trace.options import TraceOptions

#: Optimizer state tensors per parameter (AdamW/Adam: exp_avg, exp_avg_sq; momentum: 1).
_STATES = {"adamw": 2, "adam": 2, "sgd-momentum": 1, "sgd": 0, "none": 0}
COMPILE_NOTE = ("moot under torch.compile: inductor pads misaligned matmul operands itself "
                "(torch._inductor.config.shape_padding), at the cost of a copy")


def target(v: int, multiple: int) -> int:
    return math.ceil(v / multiple) * multiple


def _multiple(dtype: str, base: Base) -> int:
    """Elements in 128 bytes (A100 and later) or 16 bytes (earlier) of the math dtype."""
    size = DTYPE_BYTES.get(dtype, 2)
    return (128 if base.gpu.arch.prefers_128_byte_alignment else 16) // size


def families(base: Base) -> dict[str, dict[int, int]]:
    """{family: {dimension: padded}} for the misaligned dimensions of tensor-core GEMMs."""
    trace = base.analysis.trace
    types = trace.module_types
    embedding_rows, linear_dims = set(), defaultdict(int)
    for name, shape in trace.param_shapes.items():
        owner = types.get(name.rsplit(".", 1)[0], "")
        if owner == "Embedding" and len(shape) == 2:
            embedding_rows.add(shape[0])
        elif owner == "Linear" and len(shape) == 2:
            for d in shape:
                linear_dims[d] += 1
    hidden = max(linear_dims, key=linear_dims.get) if linear_dims else None
    seq = base.analysis.workload.info.get("seq_len")
    out: dict[str, dict[int, int]] = defaultdict(dict)
    channels = channel_pads(base)
    for t in base.prediction.step.ops:
        if t.category == cat.CONV:  # a convolution pads its channels (``channel_pads``)
            continue
        for gt in t.gemms:
            est = gt.estimate
            if est.math_unit != "tensor":
                continue
            mult = _multiple(est.rate_dtype, base)
            g = gt.gemm
            for dim in (g.m, g.n, g.k):
                if dim % mult == 0 or dim < mult:
                    continue
                family = _family(dim, t.category, g, embedding_rows, hidden, seq, trace)
                out[family][dim] = target(dim, mult)
    out["channels"].update({dim: pad.padded for dim, pad in channels.items()})
    return {f: dims for f, dims in out.items() if dims}


@dataclass(frozen=True)
class ChannelPad:
    """A convolution GEMM dimension padded by padding channels: the input channels (per group)
    times the kernel's positions (K of the forward), or the output channels (N)."""

    dim: int
    padded: int
    side: str  # "input" or "output"
    channels: int
    padded_channels: int
    kernel: tuple[int, ...]  # the kernel's spatial size (input side)

    def describe(self) -> str:
        if self.side == "output":
            return f"output channels {self.channels} -> {self.padded_channels}"
        area = " x ".join(map(str, self.kernel))
        return (f"input channels {self.channels} -> {self.padded_channels} (K = channels x {area} "
                f"kernel: {self.dim} -> {self.padded})")


def channel_pads(base: Base) -> dict[int, ChannelPad]:
    """The convolution GEMM dimensions that are not tensor-core aligned, each with the channel
    padding that aligns it: a convolution's dimensions are its channels, so only a channel
    count can be padded, and K = C x R x S grows by whole kernels. NVIDIA's rule for
    tensor-core convolutions is channels (and so K) a multiple of 16 bytes, 8 fp16/bf16
    elements ("Convolutional Layers User's Guide"); the channels are padded to the smallest
    count that makes the padded dimension such a multiple. Depthwise and transposed
    convolutions, and M (images x output positions), are left out."""
    out: dict[int, ChannelPad] = {}
    for t in base.prediction.step.ops:
        if t.category != cat.CONV:
            continue
        geometry = _conv_channels(t.count.event)
        for gt in t.gemms:
            if gt.estimate.math_unit != "tensor" or geometry is None:
                continue
            per16 = max(1, 16 // DTYPE_BYTES.get(gt.estimate.rate_dtype, 2))
            cin, cout, kernel = geometry
            area = math.prod(kernel)
            g = gt.gemm
            for dim in (g.m, g.n, g.k):
                if dim % per16 == 0 or dim in out:
                    continue
                if dim == cin * area:
                    step = per16 // math.gcd(area, per16)
                    wide = target(cin, step)
                    out[dim] = ChannelPad(dim, wide * area, "input", cin, wide, kernel)
                elif dim == cout:
                    out[dim] = ChannelPad(dim, target(cout, per16), "output", cout, target(cout, per16), kernel)
    return out


def _conv_channels(event: OpEvent) -> tuple[int, int, tuple[int, ...]] | None:
    """(input channels per group, output channels per group, kernel size) of an ordinary
    convolution's forward or backward event; None for a transposed or depthwise one."""
    backward = event.name == "aten.convolution_backward"
    args = event.args
    weight = args[2] if backward else args[1]
    transposed = bool(args[7] if backward else (args[6] if len(args) > 6 else False))
    groups = int(args[9] if backward else (args[8] if len(args) > 8 else 1))
    if transposed or not isinstance(weight, TensorMeta) or len(weight.shape) < 3:
        return None
    cin = weight.shape[1]
    if groups > 1 and cin == 1:
        return None  # depthwise: direct kernels, no tensor-core tiles
    return cin, weight.shape[0] // groups, tuple(weight.shape[2:])


def _family(dim, category, gemm, embedding_rows, hidden, seq, trace) -> str:  # type: ignore[no-untyped-def]
    if dim in embedding_rows:
        return "vocabulary"
    if seq and (dim == seq or (dim % seq == 0 and gemm.m == dim and dim not in (hidden,))):
        return "sequence"
    if gemm.batch > 1 and not any(dim in s for s in trace.param_shapes.values()):
        return "heads"
    if dim == hidden:
        return "hidden"
    if hidden and dim > hidden:
        return "FFN"
    return "other"


def candidates(base: Base) -> list[Candidate]:
    out = []
    channels = channel_pads(base)
    for family, dims in sorted(families(base).items()):
        pad = tuple(sorted(dims.items()))
        shown = ", ".join(f"{v} -> {p}" for v, p in pad)
        layers = sorted({gt.gemm.module for t in base.prediction.step.ops for gt in t.gemms
                         if {gt.gemm.m, gt.gemm.n, gt.gemm.k} & set(dims)})
        out.append(Candidate(
            name=f"pad-{family.lower()}", family="padding",
            title=f"pad the {family} dimension{'s' if len(pad) > 1 else ''} to tensor-core multiples ({shown})",
            change=Change(pad=pad), how=_how(family, pad, channels), layers=layers,
            assumptions=[
                "every GEMM dimension equal to a padded value is padded (M, N or K), and the "
                "padded rows/columns are computed and ignored (masked in the loss, never read)",
                "streaming ops over a padded tensor move proportionally more bytes",
                "memory: padded parameters, their gradients and optimizer states, and the "
                "largest padded activation with its gradient",
                COMPILE_NOTE,
            ],
        ))
    return out


def _how(family: str, pad: tuple[tuple[int, int], ...], channels: dict[int, ChannelPad]) -> str:
    (v, p), *_ = pad
    if family == "vocabulary":
        return f"vocab_size = {p}  # {v} padded to a multiple of {_pow2(p)}; targets never use the extra rows"
    if family == "channels":  # the dimensions the rewrite pads, said as the channels that give them
        return ("pad the convolution channels: " + "; ".join(channels[a].describe() for a, _ in pad)
                + " (zero channels: the input image with F.pad, or wider conv layers)")
    if family == "sequence":
        return "pad the sequence length so batch x seq is a multiple of " + str(_pow2(p))
    return f"{family} size: " + ", ".join(f"{a} -> {b}" for a, b in pad)


def _pow2(v: int) -> int:
    return v & -v


def rewrite(analysis: Analysis, options: MemoryOptions, rw: Rewritten, pad: dict[int, int]) -> None:
    """Pad every GEMM dimension in ``pad`` and scale the streaming ops over padded tensors;
    add the padded parameters' memory."""
    counts = []
    extra_flops = 0.0
    for c in rw.counts:
        if c.gemms:
            gemms = tuple(replace(g, m=pad.get(g.m, g.m), n=pad.get(g.n, g.n), k=pad.get(g.k, g.k))
                          for g in c.gemms)
            added = sum(g.flops for g in gemms) - sum(g.flops for g in c.gemms)
            if added:
                extra_flops += added
                ratio = 1 + added / max(1.0, sum(g.flops for g in c.gemms))
                c = replace(c, gemms=gemms, flops=c.flops + added, bytes_in=c.bytes_in * ratio,
                            bytes_out=c.bytes_out * ratio)
                rw.touched.add(c.module)
        else:
            ratio = _ratio(c.event.inputs + c.event.outputs, pad)
            if ratio > 1:
                c = replace(c, bytes_in=c.bytes_in * ratio, bytes_out=c.bytes_out * ratio,
                            flops=c.flops * ratio)
        counts.append(c)
    rw.counts = counts
    rw.memory_delta += _memory(analysis.trace, options.trace, pad)
    rw.notes.append(f"padded GEMM FLOPs: +{extra_flops:.3g}")


def _ratio(metas, pad: dict[int, int]) -> float:  # type: ignore[no-untyped-def]
    best = 1.0
    for m in metas:
        for d in m.shape:
            if d in pad:
                best = max(best, pad[d] / d)
    return best


def _memory(trace: Trace, step: TraceOptions, pad: dict[int, int]) -> float:
    """Padded parameters x (weight + gradient + optimizer states), plus the largest padded
    forward activation and its gradient (the logits, for a vocabulary)."""
    per_param = 1 + (1 + _STATES.get(step.optimizer, 2) if step.train else 0)
    extra = 0.0
    for sid, name in trace.param_storages.items():
        shape = trace.param_shapes[name]
        ratio = math.prod(pad.get(d, d) for d in shape) / max(1, math.prod(shape))
        extra += trace.storages[sid].nbytes * (ratio - 1) * per_param
    largest = 0.0
    for ev in trace.events:
        if ev.phase == "forward":
            for m in ev.outputs:
                r = _ratio([m], pad)
                if r > 1:
                    largest = max(largest, m.nbytes * (r - 1))
    return extra + largest * (2 if step.train else 1)
