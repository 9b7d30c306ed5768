"""PyTorch's hand-written CUDA kernels whose threads walk a loop one element at a time.

Batch norm's NCHW kernels (``Normalization.cuh``: one block per channel that reduces the
channel's N*H*W elements), max pooling's NCHW kernels (``DilatedMaxPool2d.cu``: a thread per
output looping over its window, a thread per input looping over the outputs that cover it) and
the depthwise convolution's weight gradient (``DepthwiseConv2d.cu``: one block per filter tap)
load one scalar per thread and loop iteration, and each iteration waits for its loads before
the next issues (a Welford update or a compare depends on them; the accessors are not
``__restrict__`` where they also store). Such a loop is bound by latency, not bandwidth: a
wave of resident threads takes its iterations times one memory round trip, however few bytes
each iteration moves. With one block per channel, a batch norm over 64 channels keeps 64 SMs
busy with one 512-thread block each, and streams a 100 MB activation at a few hundred GB/s.

``LoopKernel`` describes one such launch as its source does (grid, block, iterations per
thread); ``loop_kernel_time`` gives its time: waves of resident blocks times iterations times
the round trip (``DeviceProfile.loop_iteration_cycles`` at the GPU's clock), never less than
its bytes at the achievable bandwidth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from nnperf.hardware import GPU, DeviceProfile
from nnperf.hardware.architecture import resident_limits

#: ``LoopKernel.library``: PyTorch's own kernels, and cuDNN's batch-norm loops (the prefixes
#: of their ops: ``aten.native_batch_norm``, ``aten.cudnn_batch_norm``).
NATIVE, CUDNN = "native", "cudnn"


@dataclass(frozen=True, slots=True)
class LoopKernel:
    """One launch of a per-thread loop kernel, as its launch code configures it."""

    name: str  # the CUDA kernel's name in PyTorch's source
    blocks: int  # grid size (all dimensions multiplied)
    threads: int  # threads per block
    iterations: int  # dependent loop iterations of one thread (each waits for its loads)
    bytes: float  # DRAM traffic of the launch: the floor its bandwidth sets
    #: whose loop: PyTorch's own (NATIVE: ``loop_iteration_cycles``), or cuDNN's batch norm
    #: (CUDNN: that times ``cudnn_batch_norm_loop_fraction``)
    library: str = NATIVE

    def __post_init__(self) -> None:
        if self.blocks < 1 or self.threads < 1 or self.iterations < 0 or self.bytes < 0:
            raise ValueError(f"bad loop kernel {self!r}")


def resident_blocks(threads: int, gpu: GPU) -> int:
    """Blocks of ``threads`` threads the whole GPU holds at once: per SM, the fewer of the
    thread limit over the block size and the block limit (CUDA's occupancy rules, registers
    and shared memory aside), times the SMs."""
    max_threads, max_blocks = resident_limits(gpu.compute_capability)
    per_sm = max(1, min(max_threads // max(1, threads), max_blocks))
    return per_sm * gpu.sm_count


def waves(kernel: LoopKernel, gpu: GPU) -> int:
    """Rounds of resident blocks the grid takes."""
    return math.ceil(kernel.blocks / resident_blocks(kernel.threads, gpu))


def round_trip_s(gpu: GPU, profile: DeviceProfile, library: str = NATIVE) -> float:
    """Seconds of one dependent loop iteration: ``loop_iteration_cycles`` at the boost clock
    (a latency-bound loop leaves the SM idle and power low: it runs at the top clock); cuDNN's
    batch-norm loops that times ``cudnn_batch_norm_loop_fraction``."""
    fraction = profile.cudnn_batch_norm_loop_fraction if library == CUDNN else 1.0
    return profile.loop_iteration_cycles * fraction / (gpu.boost_clock_mhz * 1e6)


def loop_kernel_time(kernel: LoopKernel, gpu: GPU, profile: DeviceProfile) -> float:
    """Seconds of ``kernel`` without its launch overhead: its waves of dependent iterations,
    or its bytes at the achievable bandwidth, whichever is longer."""
    latency = waves(kernel, gpu) * kernel.iterations * round_trip_s(gpu, profile, kernel.library)
    return max(latency, profile.memory_time(gpu.memory_bandwidth, kernel.bytes))
