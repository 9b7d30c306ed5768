"""Data movement: copies and dtype casts, concatenation, padding, reordering, resampling.

These kernels do no arithmetic (FLOPs 0, except the interpolation and gradient
accumulation noted below); they read each source once at its own size and write each
result once. A cast's bytes differ on the two sides (fp32 in, bf16 out), which is exactly
why autocast costs what it costs. ``info["cast"]`` marks dtype conversions.
"""

from __future__ import annotations

import re

from nnperf.passes.costs.common import bind, distinct, footprint, read_args
from nnperf.passes.costs.registry import ELEMENTWISE, MEMORY, OpCost, register, written_args
from nnperf.trace.events import OpEvent

COPIES = (
    "aten._to_copy",
    "aten.clone",
    "aten.contiguous",
    "aten.cat",
    "aten.stack",
    "aten.hstack",
    "aten.vstack",
    "aten.split_with_sizes_copy",
    "aten.split_copy",
    "aten.unbind_copy",
    "aten.expand_copy",
    "aten.permute_copy",
    "aten.transpose_copy",
    "aten.t_copy",
    "aten.view_copy",
    "aten._reshape_copy",
    "aten.slice_copy",
    "aten.select_copy",
    "aten.squeeze_copy",
    "aten.unsqueeze_copy",
    "aten.detach_copy",
    "aten.alias_copy",
    "aten.diagonal_copy",
    "aten.as_strided_copy",
    "aten.unfold_copy",
    "aten.constant_pad_nd",
    "aten.reflection_pad1d",
    "aten.reflection_pad2d",
    "aten.reflection_pad3d",
    "aten.replication_pad1d",
    "aten.replication_pad2d",
    "aten.replication_pad3d",
    "aten.repeat",
    "aten.repeat_interleave",
    "aten.flip",
    "aten.roll",
    "aten.tril",
    "aten.triu",
    "aten.pixel_shuffle",
    "aten.pixel_unshuffle",
    "aten.channel_shuffle",
    "aten.upsample_nearest1d",
    "aten.upsample_nearest2d",
    "aten.upsample_nearest3d",
    "aten._upsample_nearest_exact1d",
    "aten._upsample_nearest_exact2d",
    "aten._upsample_nearest_exact3d",
    "aten.slice_scatter",
    "aten.select_scatter",
    "aten.diagonal_scatter",
    "aten.as_strided_scatter",
    "aten.tril_",
    "aten.triu_",
)


@register(*COPIES)
def _copy(event: OpEvent) -> OpCost:
    written = written_args(event)
    writes = distinct(written or event.outputs)
    reads = read_args(event)
    return OpCost(MEMORY, reads=reads, writes=writes, info=_cast_info(reads, writes))


@register("aten.copy_", "aten.copy", "aten._copy_from", "aten._copy_from_and_resize")
def _copy_into(event: OpEvent) -> OpCost:
    """``dst.copy_(src)`` reads only ``src``; the destination's old contents are not read."""
    args = bind(event)
    src = args["src"]
    dst = args.get("self") if event.name == "aten.copy_" else None
    writes = [dst] if dst is not None else distinct(event.outputs)
    if event.name == "aten.copy":  # functional copy(self, src): a new tensor shaped like self
        writes = distinct(event.outputs)
    reads = [footprint(src)]
    return OpCost(MEMORY, reads=reads, writes=writes, info=_cast_info(reads, writes))


def _cast_info(reads, writes) -> dict[str, bool]:
    if reads and writes and reads[0].dtype != writes[0].dtype:
        return {"cast": True}
    return {}


# Backward of padding and unfolding: gradients of positions that were copied more than once
# are summed, one add per grad_output element.
@register(
    "aten.reflection_pad1d_backward",
    "aten.reflection_pad2d_backward",
    "aten.reflection_pad3d_backward",
    "aten.replication_pad1d_backward",
    "aten.replication_pad2d_backward",
    "aten.replication_pad3d_backward",
    "aten.unfold_backward",
)
def _accumulating_copy(event: OpEvent) -> OpCost:
    grads = [t for t in read_args(event) if t.shape]
    grad = grads[0] if grads else event.inputs[0]
    return OpCost(MEMORY, flops=float(grad.numel), reads=[footprint(grad)], writes=event.outputs)


# Interpolation taps per output element: 2 per linear dimension; FLOPs = 2 * taps - 1.
_INTERPOLATION_TAPS = {"linear1d": 2, "bilinear2d": 4, "trilinear3d": 8, "bicubic2d": 16}


@register(
    *(f"aten.upsample_{kind}" for kind in _INTERPOLATION_TAPS),
    *(f"aten.upsample_{kind}_backward" for kind in _INTERPOLATION_TAPS),
    *(f"aten._upsample_{kind}_aa" for kind in ("bilinear2d", "bicubic2d")),
    *(f"aten._upsample_{kind}_aa_backward" for kind in ("bilinear2d", "bicubic2d")),
    "aten.upsample_nearest1d_backward",
    "aten.upsample_nearest2d_backward",
    "aten.upsample_nearest3d_backward",
    "aten._upsample_nearest_exact1d_backward",
    "aten._upsample_nearest_exact2d_backward",
    "aten._upsample_nearest_exact3d_backward",
)
def _resample(event: OpEvent) -> OpCost:
    """Weighted sums of neighbouring inputs (forward), or the same weights scattered back and
    summed (backward). Nearest-neighbour forward is a plain copy (registered above)."""
    found = re.search(r"upsample_(\w+?\dd)", event.name)
    kind = found.group(1) if found else ""
    taps = _INTERPOLATION_TAPS.get(kind, 1)
    grad_or_input = read_args(event)[0]
    out = event.outputs[0]
    per_source = grad_or_input if event.name.endswith("_backward") else out
    flops = per_source.numel * (2 * taps - 1 if taps > 1 else 1)
    return OpCost(ELEMENTWISE, flops=float(flops), reads=[grad_or_input], writes=[out])
