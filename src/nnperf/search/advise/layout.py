"""``channels_last`` for convolutional networks.

cuDNN's tensor-core convolution kernels run NHWC; on NCHW tensors PyTorch adds layout
transposes around them (NVIDIA's guide; the PyTorch memory-format tutorial). nnperf's time
model does not cost memory formats yet (every convolution is timed as its implicit GEMM in
one layout), so the item is offered with its change and no predicted gain rather than a
number the model cannot back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nnperf.passes.costs import registry as cat
from nnperf.search.advise.change import Candidate, Change

if TYPE_CHECKING:
    from nnperf.search.advise.evaluate import Base


def candidates(base: Base) -> list[Candidate]:
    convs = [c for c in base.analysis.ops if c.category == cat.CONV and len(c.event.inputs[0].shape) == 4]
    if not convs:
        return []  # not offered: no 2-D convolution (a transformer, an MLP)
    if all(_is_channels_last(c.event.inputs[0]) for c in convs):
        base.checked.append(("channels-last", "the convolutions already read channels_last tensors"))
        return []
    return [Candidate(
        name="channels-last", family="layout", title="channels_last memory format for the convolutions",
        change=Change(), predicted=False,
        how="model = model.to(memory_format=torch.channels_last); x = x.to(memory_format=torch.channels_last)",
        layers=sorted({c.module for c in convs})[:8],
        assumptions=["not predicted: nnperf's convolution model does not cost memory formats yet "
                     "(NCHW and NHWC time the same), so no gain is claimed",
                     "published: most of the gain comes with AMP on tensor cores"],
    )]


def _is_channels_last(meta) -> bool:  # type: ignore[no-untyped-def]
    _n, c, _h, _w = meta.shape
    return c > 1 and meta.stride[1] == 1 and meta.stride[-1] == c
