"""``channels_last`` for convolutional networks, re-traced and re-predicted.

cuDNN's tensor-core convolution kernels run NHWC; on NCHW tensors PyTorch's cuDNN path
transposes the input and filter in (and the gradients back) around each of them
(``passes.costs.matmul.nchw_transposes``, timed by ``passes.timing``). The item traces the step
again as ``model.to(memory_format=torch.channels_last)`` runs it (``TraceOptions.channels_last``:
weights and 4-D inputs NHWC, so PyTorch keeps the activations NHWC) and predicts its time and
memory like any other step: the transposes disappear, the convolutions and the ops between
them are the same. CUDA-core convolutions (fp32 without TF32) run NCHW natively, so there the
item predicts no gain and is listed as checked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nnperf.passes.costs import registry as cat
from nnperf.passes.costs.matmul import channels_last
from nnperf.search.advise.change import Candidate, Change

if TYPE_CHECKING:
    from nnperf.search.advise.evaluate import Base


def candidates(base: Base) -> list[Candidate]:
    convs = [c for c in base.analysis.ops if c.category == cat.CONV and len(c.event.inputs[0].shape) == 4]
    if not convs:
        return []  # not offered: no 2-D convolution (a transformer, an MLP)
    if base.options.trace.channels_last or all(channels_last(c.event.inputs[0]) for c in convs):
        base.checked.append(("channels-last", "the convolutions already read channels_last tensors"))
        return []
    return [Candidate(
        name="channels-last", family="layout", title="channels_last memory format for the convolutions",
        change=Change(trace=(("channels_last", True),)),
        how="model = model.to(memory_format=torch.channels_last); x = x.to(memory_format=torch.channels_last)"
            "   (nnperf: --channels-last)",
        layers=sorted({c.module for c in convs})[:8],
        assumptions=["the step re-traced with NHWC weights and inputs: cuDNN's NCHW<->NHWC transposes around "
                     "each tensor-core convolution disappear (each a read and a write of the tensor at the "
                     "achievable bandwidth, and a kernel); the convolution kernels themselves are timed alike",
                     "ops without a channels_last kernel would add their own permutes: not modeled "
                     "(PyTorch's list of channels_last operators covers the usual CNN layers)"],
    )]
