"""The kernels a CUDA batch norm runs: cuDNN's, or PyTorch's native ones per layout and pass.

Which backend (``aten/src/ATen/native/Normalization.cpp``, ``_select_batch_norm_backend``):
cuDNN when neither the input nor the weight is bf16, an fp16 input comes with fp32 weights,
weight and bias exist, running statistics exist (or training has none), the input has at
least 3 dimensions, the batch is at most 880,801 (training) or 65,535 (evaluation), eps is at
least cuDNN's minimum (1e-5) and the input has fewer than 2^31 elements. Otherwise PyTorch's
own kernels run: under bf16 autocast the convolution hands batch norm a bf16 input with fp32
weights, so every bf16 CNN runs the native kernels (the H200's op lists show
``native_batch_norm`` under bf16 autocast, ``cudnn_batch_norm`` in fp32:
``validation/data/h200-sxm/cuda-ops.json``).

The native kernels (``aten/src/ATen/native/cuda/Normalization.cu`` and ``Normalization.cuh``,
the same structure from PyTorch 1.9 to 2.11) take one of two paths by layout:

- contiguous (NCHW): training forward is ``batch_norm_collect_statistics_kernel`` (a grid of C
  blocks, one per channel, each of 512 threads walking the channel's N x H*W elements one at a
  time: Welford), a small kernel that updates the running statistics, then
  ``batch_norm_transform_input_kernel`` (a grid of C x min(256K / C, N / tb) blocks); evaluation
  is a copy of the running mean, a small kernel for 1/sqrt(var + eps) and the same transform.
  The training backward is one fused ``batch_norm_backward_kernel``: C blocks of 512 threads,
  each reducing its channel's dy and (x - mean) * dy, then writing its channel's dx in a
  second loop over the same elements. With C blocks of one scalar load per thread and
  iteration, these are latency-bound loops (``kernels.native_loops``);
- channels-last: ``batch_norm_collect_statistics_channels_last_kernel`` (4 loads in flight per
  thread over a grid split along N*H*W too), the small update, and
  ``batch_norm_transform_input_channels_last_kernel``; backward is
  ``batch_norm_backward_reduce_channels_last_kernel`` then ``batch_norm_backward_elemt_channels_last_kernel``:
  streaming kernels, timed by their bytes like any other (``passes.timing``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from nnperf.kernels.native_loops import CUDNN, LoopKernel

#: cuDNN's smallest batch-norm epsilon (``CUDNN_BN_MIN_EPSILON``, cudnn.h: 1e-5).
CUDNN_MIN_EPSILON = 1e-5
#: Batch sizes cuDNN's spatial batch norm takes (``_select_batch_norm_backend``).
CUDNN_MAX_BATCH_TRAINING = 880801
CUDNN_MAX_BATCH_EVAL = 65535
#: ``MAX_BLOCK_SIZE`` of Normalization.cuh (CUDA; 256 on ROCm).
MAX_BLOCK_SIZE = 512
#: ``MAX_GRID_SIZE`` of Normalization.cuh: the cap of a grid's y dimension.
MAX_GRID_SIZE = 65535

BACKWARD_OPS = frozenset({"aten.native_batch_norm_backward", "aten.batch_norm_backward",
                          "aten.cudnn_batch_norm_backward", "aten.miopen_batch_norm_backward"})
FORWARD_OPS = frozenset({"aten.native_batch_norm", "aten._native_batch_norm_legit",
                         "aten._native_batch_norm_legit_functional",
                         "aten._native_batch_norm_legit_no_training", "aten._batch_norm_with_update",
                         "aten._batch_norm_with_update_functional", "aten._batch_norm_no_update",
                         "aten.cudnn_batch_norm", "aten.miopen_batch_norm"})


@dataclass(frozen=True, slots=True)
class BatchNormCall:
    """What the backend choice and the launch configurations read from one batch-norm op."""

    batch: int  # N
    channels: int  # C
    spatial: int  # H*W (every dimension after the channels)
    itemsize: int  # bytes per element of the activation
    input_dtype: str
    weight_dtype: str | None  # None: no affine weight
    has_bias: bool
    running_stats: bool
    training: bool
    backward: bool
    want_input_grad: bool  # backward: grad_input asked for (output_mask[0])
    want_param_grads: bool  # backward: grad_weight or grad_bias asked for
    channels_last: bool  # the input is channels-last contiguous (stride 1 on C)
    contiguous: bool  # either layout's contiguous form (else TensorIterator's general path)
    eps: float
    numel: int

    @property
    def elements(self) -> int:
        return self.batch * self.channels * self.spatial

    @property
    def plane_bytes(self) -> float:
        """Bytes of one activation tensor (x, y, dy or dx)."""
        return float(self.elements * self.itemsize)


def uses_cudnn(call: BatchNormCall, rank: int = 4) -> bool:
    """Whether PyTorch hands the call to cuDNN (module docstring)."""
    if call.input_dtype == "bf16" or call.weight_dtype in (None, "bf16") or not call.has_bias:
        return False
    if call.input_dtype == "fp16" and call.weight_dtype != "fp32":
        return False
    if not call.running_stats and not call.training:
        return False
    limit = CUDNN_MAX_BATCH_TRAINING if call.training else CUDNN_MAX_BATCH_EVAL
    return (rank >= 3 and call.batch <= limit and call.eps >= CUDNN_MIN_EPSILON
            and call.numel < 2**31 - 1)


def num_threads(n: int) -> int:
    """``getNumThreads``: the smallest of 32, 64, 128, 256 threads covering ``n``, else 512."""
    for size in (32, 64, 128, 256):
        if n <= size:
            return size
    return MAX_BLOCK_SIZE


def last_pow2(n: int) -> int:
    """``lastPow2``: the largest power of two not above ``n`` (at least 1)."""
    return 1 << max(0, int(n).bit_length() - 1)


def _plane_loop(call: BatchNormCall) -> tuple[int, int]:
    """(threads per block, iterations per thread) of the one-block-per-channel kernels
    (statistics, fused backward): a block of (getNumThreads(H*W), 512 / that) threads walks
    the channel's N x H*W elements."""
    tx = num_threads(call.spatial)
    ty = max(1, MAX_BLOCK_SIZE // tx)
    return tx * ty, math.ceil(call.batch / ty) * math.ceil(call.spatial / tx)


def _transform(call: BatchNormCall, name: str, tensors: int) -> LoopKernel:
    """``batch_norm_transform_input_kernel`` / ``batch_norm_backward_elemt_kernel``'s grid:
    threads (tf, tb) with tf = max(getNumThreads(HW / 4), min(getNumThreads(HW), 64)) and
    tb = max(64 / tf, 1); blocks (C, min(256K / C, ceil(N / tb))), y capped at 65535."""
    tf = max(num_threads(call.spatial // 4), min(num_threads(call.spatial), 64))
    tb = max(64 // tf, 1)
    gy = min(MAX_GRID_SIZE, max(1, min((256 * 1024) // call.channels, math.ceil(call.batch / tb))))
    iterations = math.ceil(call.spatial / tf) * math.ceil(call.batch / (tb * gy))
    return LoopKernel(name, blocks=call.channels * gy, threads=tf * tb, iterations=iterations,
                      bytes=tensors * call.plane_bytes)


@dataclass(frozen=True, slots=True)
class Launches:
    """The kernels of one batch-norm op as the time model takes them."""

    loops: tuple[LoopKernel, ...] = ()  # per-thread loops (``kernels.native_loops``)
    streamed: int = 0  # streaming kernels timed by the op's bytes, shared among them
    small: int = 0  # kernels over per-channel vectors (statistics updates, 1/sqrt): launch cost only

    @property
    def kernels(self) -> int:
        return len(self.loops) + self.streamed + self.small


#: Threads per block of cuDNN's NCHW training kernels: ``cudnn::bn_fw_tr_1C11_kernel_NCHW<float,
#: float, int=512, bool=0, int=2>`` (nvprof in pytorch/pytorch#57034), a grid over the channels.
CUDNN_NCHW_THREADS = 512


def launches(call: BatchNormCall, cudnn: bool) -> Launches:
    """The kernels ``call`` runs: cuDNN's, the native channels-last or general path's
    streaming kernels, or the native NCHW loops.

    cuDNN's NCHW training kernels are, like PyTorch's, one block per channel walking the
    channel's N*H*W elements (the forward reads them for the statistics, then again to write
    the output; the backward reduces, then writes the input gradient): per-thread loops, not
    streams. The H200's kernel bench bears it out: an fp16 batch norm over 64 channels of
    64x112x112 took 590 us forward and 1,120 us backward (523 and 459 GB/s), over 1024
    channels of 64x14x14 at 2.7-3.2 TB/s (validation/data/h200-sxm/kernel-bench-*.json). Its
    channels-last and evaluation kernels stream (89 us forward over the same 64 channels in
    channels-last). Its loops keep more loads in flight than PyTorch's: their round trip is
    ``cudnn_batch_norm_loop_fraction`` of ``loop_iteration_cycles``, from the same rows."""
    if cudnn:
        if (call.training or call.backward) and call.contiguous and not call.channels_last:
            per_pass = math.ceil(call.batch * call.spatial / CUDNN_NCHW_THREADS)
            name = "cudnn::bn_bw_1C11_kernel" if call.backward else "cudnn::bn_fw_tr_1C11_kernel_NCHW"
            # the forward's two sweeps take two elements a thread per iteration (its template's
            # last argument, 2); the backward's one
            sweeps = 2 if call.backward else 1
            return Launches(loops=(LoopKernel(name, blocks=call.channels, threads=CUDNN_NCHW_THREADS,
                                              iterations=sweeps * per_pass,
                                              bytes=(5 if call.backward else 3) * call.plane_bytes,
                                              library=CUDNN),))
        return Launches(streamed=1)
    needs_reduction = call.training or call.want_param_grads
    if not (call.contiguous and not call.channels_last):
        if call.backward:  # reduce (when needed), then the elementwise gradient
            return Launches(streamed=int(needs_reduction) + int(call.want_input_grad))
        # statistics and the update, or the running mean's copy and 1/sqrt; then the transform
        return Launches(streamed=2, small=1) if call.training else Launches(streamed=1, small=2)
    threads, per_pass = _plane_loop(call)
    if not call.backward:
        transform = _transform(call, "batch_norm_transform_input_kernel", tensors=2)
        if not call.training:
            return Launches(loops=(transform,), small=2)
        stats = LoopKernel("batch_norm_collect_statistics_kernel", blocks=call.channels, threads=threads,
                           iterations=per_pass, bytes=call.plane_bytes)
        return Launches(loops=(stats, transform), small=1)
    if needs_reduction and call.want_input_grad:
        # reduce dy and (x - mean) * dy, then write dx: two loops over the channel's elements,
        # reading dy and x in both
        fused = LoopKernel("batch_norm_backward_kernel", blocks=call.channels, threads=threads,
                           iterations=2 * per_pass, bytes=5 * call.plane_bytes)
        return Launches(loops=(fused,))
    loops = []
    if needs_reduction:
        block_y = min(last_pow2(call.batch), MAX_BLOCK_SIZE // 32)
        block_x = min(max(num_threads(call.spatial), 32), MAX_BLOCK_SIZE // block_y)
        loops.append(LoopKernel(
            "batch_norm_backward_reduce_kernel", blocks=call.channels, threads=block_x * block_y,
            iterations=math.ceil(call.batch / block_y) * math.ceil(call.spatial / block_x),
            bytes=2 * call.plane_bytes))
    # evaluation: dx = dy * weight / sqrt(running_var + eps), a TensorIterator kernel after
    # the 1/sqrt
    return Launches(loops=tuple(loops), streamed=int(call.want_input_grad), small=int(not call.training))
