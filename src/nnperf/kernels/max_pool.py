"""2-D max pooling on CUDA: PyTorch's NCHW kernels are per-thread loops over a window.

``aten/src/ATen/native/cuda/DilatedMaxPool2d.cu`` (the kernels come from Caffe):

- forward, contiguous input: ``max_pool_forward_nchw``, a thread per output element (blocks of
  256), looping over its window's taps (clipped at the borders), each a load and a compare
  whose result decides the next: a latency-bound loop (``kernels.native_loops``);
- backward, contiguous: ``gradInput.zero_()``, then ``max_pool_backward_nchw`` on a grid
  (H*W / 256, N, C): a thread per *input* element loops over the outputs whose windows cover
  it, loading each one's argmax (int64) and, where it is this element, its gradient;
- channels-last: ``max_pool_forward_nhwc`` / ``max_pool_backward_nhwc`` walk the channels
  innermost, coalesced, with partial results in shared memory: streaming kernels, timed by
  their bytes (``passes.timing``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from nnperf.kernels.native_loops import LoopKernel

#: ``BLOCK_THREADS`` of the NCHW kernels (the forward takes min(maxThreadsPerBlock, 256)).
BLOCK_THREADS = 256
#: Bytes of one argmax index (int64).
INDEX_BYTES = 8

FORWARD = "aten.max_pool2d_with_indices"
BACKWARD = "aten.max_pool2d_with_indices_backward"


def window_taps(size: int, out: int, kernel: int, stride: int, pad: int, dilation: int) -> list[int]:
    """Taps of each output's window along one dimension (the kernel clips them at the
    borders: ``hstart`` raised past the padding, ``hend`` capped at the input size)."""
    taps = []
    for o in range(out):
        start = o * stride - pad
        end = min(start + (kernel - 1) * dilation + 1, size)
        while start < 0:
            start += dilation
        taps.append(max(0, math.ceil((end - start) / dilation)))
    return taps


def covering(size: int, out: int, kernel: int, stride: int, pad: int, dilation: int) -> list[int]:
    """Outputs the backward kernel visits for each input position along one dimension
    (``p_start`` .. ``p_end`` of DilatedMaxPool2d.cu)."""
    span = (kernel - 1) * dilation + 1
    counts = []
    for i in range(size):
        start = 0 if i + pad < span else (i + pad - span) // stride + 1
        end = min((i + pad) // stride + 1, out)
        counts.append(max(0, end - start))
    return counts


@dataclass(frozen=True, slots=True)
class MaxPoolCall:
    batch: int
    channels: int
    in_hw: tuple[int, int]
    out_hw: tuple[int, int]
    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    itemsize: int
    channels_last: bool
    backward: bool

    @property
    def planes(self) -> int:
        return self.batch * self.channels

    def forward_taps(self) -> float:
        """Mean window taps per output element."""
        rows = window_taps(self.in_hw[0], self.out_hw[0], self.kernel[0], self.stride[0], self.padding[0],
                             self.dilation[0])
        cols = window_taps(self.in_hw[1], self.out_hw[1], self.kernel[1], self.stride[1], self.padding[1],
                             self.dilation[1])
        return (sum(rows) / len(rows)) * (sum(cols) / len(cols)) if rows and cols else 0.0

    def backward_visits(self) -> float:
        """Mean outputs a backward thread visits per input element."""
        rows = covering(self.in_hw[0], self.out_hw[0], self.kernel[0], self.stride[0], self.padding[0],
                        self.dilation[0])
        cols = covering(self.in_hw[1], self.out_hw[1], self.kernel[1], self.stride[1], self.padding[1],
                        self.dilation[1])
        return (sum(rows) / len(rows)) * (sum(cols) / len(cols)) if rows and cols else 0.0


def nchw_loop(call: MaxPoolCall) -> LoopKernel:
    """The NCHW kernel of ``call`` (the backward's zero fill of grad_input is a streaming
    kernel of its own, not included)."""
    inputs = call.planes * call.in_hw[0] * call.in_hw[1]
    outputs = call.planes * call.out_hw[0] * call.out_hw[1]
    if not call.backward:
        return LoopKernel("max_pool_forward_nchw", blocks=max(1, math.ceil(outputs / BLOCK_THREADS)),
                          threads=BLOCK_THREADS, iterations=max(1, math.ceil(call.forward_taps())),
                          bytes=inputs * call.itemsize + outputs * (call.itemsize + INDEX_BYTES))
    positions = call.in_hw[0] * call.in_hw[1]
    blocks = math.ceil(positions / BLOCK_THREADS) * min(call.batch, 65535) * min(call.channels, 65535)
    return LoopKernel("max_pool_backward_nchw", blocks=max(1, blocks), threads=BLOCK_THREADS,
                      iterations=max(1, math.ceil(call.backward_visits())),
                      bytes=outputs * (call.itemsize + INDEX_BYTES) + inputs * call.itemsize)
