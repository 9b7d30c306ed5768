"""Depthwise convolutions: PyTorch's direct NCHW kernels, or cuDNN's, per layout and pass.

Which kernels (``aten/src/ATen/native/Convolution.cpp``, ``_select_conv_backend`` and
``use_cudnn_depthwise``): a channels-last input always goes to cuDNN; an NCHW one goes to
cuDNN only in fp16 (cuDNN >= 8.2, at least 32 channels, no dilation, square stride: the
workload table is left out, fp16 NCHW counts as cuDNN here), otherwise (bf16, fp32) to
PyTorch's ``DepthwiseConv2d.cu``:

- forward ``conv_depthwise2d_forward_kernel``: a thread per output element, its R*S taps
  unrolled (3x3, 5x5 and 1x1 specialized), the index arithmetic (three integer divisions) and
  a bounds check per tap around each FMA: instruction-bound, so its time is its taps at a
  measured rate (``DeviceProfile.depthwise_rate``, MACs per SM per clock by kernel area);
- input gradient ``conv_depthwise2d_backward_kernel``: a thread per *input* element looping over
  all R*S taps (a stride test on each): taps = input elements x R*S, at the same rate;
- weight gradient ``conv_depthwise2d_grad_weight_kernel``: one block per (channel, tap) of
  min(32 N, 256) threads, a warp per image walking its H*W outputs 32 at a time, one gather
  and one load per iteration: a latency-bound loop (``kernels.native_loops``).

cuDNN's kernels (channels-last, fp16) are timed at their own measured rate, each gradient
pass as one more forward's work (an assumption until a backward microbenchmark exists:
``validation/kernel_bench.py`` measures them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from nnperf.hardware import GPU, DeviceProfile
from nnperf.hardware.profile import interpolate
from nnperf.kernels.native_loops import LoopKernel

#: ``getGradParamsNumThreads``' cap (DepthwiseConv2d.cu): "256 is better than 512 and 1024".
GRAD_PARAMS_MAX_THREADS = 256
WARP = 32


@dataclass(frozen=True, slots=True)
class DepthwiseCall:
    batch: int
    channels: int  # output channels (= input channels x the depth multiplier)
    input_positions: int  # H*W of the input
    output_positions: int  # P*Q of the output
    taps: int  # R*S
    itemsize: int
    dtype: str
    channels_last: bool
    backward: bool
    want_input_grad: bool
    want_weight_grad: bool

    @property
    def path(self) -> str:
        """"native" (DepthwiseConv2d.cu) or "cudnn"."""
        return "cudnn" if self.channels_last or self.dtype == "fp16" else "native"

    @property
    def rate_key(self) -> str:
        """The ``depthwise_rate`` curve this call's kernels run at
        (``hardware.profile.DEPTHWISE_RATE_KEYS``; fp16 and bf16 share one, as do fp32 and
        TF32: a depthwise kernel uses no tensor cores)."""
        return f"{self.path}_{'fp32' if self.dtype in ('fp32', 'tf32', 'fp64') else 'bf16'}"

    @property
    def output_macs(self) -> int:
        """Taps of the forward pass (and of cuDNN's gradient passes): output elements x R*S."""
        return self.batch * self.channels * self.output_positions * self.taps

    @property
    def input_taps(self) -> int:
        """Loop iterations of the native input gradient: input elements x R*S (a thread per
        input element tries every tap, stride permitting)."""
        return self.batch * self.channels * self.input_positions * self.taps


def rate(call: DepthwiseCall, gpu: GPU, profile: DeviceProfile) -> float | None:
    """MACs per second of ``call``'s tap loops on ``gpu``: the profile's MACs per SM per clock
    at this kernel area, times SMs and the boost clock; None without a curve for the key."""
    curve = profile.depthwise_rate.get(call.rate_key)
    if not curve:
        return None
    return interpolate(curve, call.taps) * gpu.sm_count * gpu.boost_clock_mhz * 1e6


def grad_weight_loop(call: DepthwiseCall, grad_output_bytes: float, input_bytes: float) -> LoopKernel:
    """``conv_depthwise2d_grad_weight_kernel``: blocks C x R*S of min(32 N, 256) threads; each
    warp takes every (threads / 32)-th image and walks its outputs 32 at a time."""
    threads = min(call.batch * WARP, GRAD_PARAMS_MAX_THREADS)
    warps = max(1, threads // WARP)
    iterations = math.ceil(call.batch / warps) * math.ceil(call.output_positions / WARP)
    return LoopKernel("conv_depthwise2d_grad_weight_kernel", blocks=call.channels * call.taps,
                      threads=threads, iterations=iterations, bytes=grad_output_bytes + input_bytes)
