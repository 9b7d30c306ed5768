"""Time prediction: each op's kernel time on a GPU, then the eager host/device timeline.

Kernel time by category:
- GEMM and convolution: the tile/wave/alignment model of ``kernels.gemm`` per lowered GEMM
  (convolutions through their implicit GEMM, each pass scaled by the profile's cuDNN
  efficiency for its class: stride, output size, pass, math unit, an RGB stem's few channels;
  NCHW tensors converted around tensor-core kernels: ``transpose_time``);
- fused attention: executed FLOPs (flash backward recomputes Q@K^T) at the profile's
  attention fraction of the tensor peak, bounded by its bytes at achievable bandwidth;
- batch norm: the kernels of the backend PyTorch picks (``kernels.batch_norm``): PyTorch's
  native NCHW kernels (bf16 autocast) as the latency-bound per-thread loops they are
  (``kernels.native_loops``), cuDNN's and the channels-last ones by their bytes;
- NCHW max pooling: its window loops (``kernels.max_pool``);
- depthwise convolutions: their tap loops at the profile's measured rate per kernel family
  (``kernels.depthwise``), the NCHW weight gradient as a loop;
- everything else: bytes at the size-dependent achievable bandwidth (or FLOPs at the CUDA
  core rate if larger), plus the per-kernel overhead; foreach ops launch one kernel per
  ``foreach_tensors_per_kernel`` tensors; a normalization's second sweep over inputs larger
  than the L2 (statistics first, then the output: ``passes.costs.norms.second_reads``) reads
  them from DRAM again.

Where the GPU has a measured L2 (``GPU.l2_reuse``), the reads ``passes.l2_reuse`` finds in
L2 leave the DRAM term of streaming ops, depthwise convolutions and convolutions' tensor
traffic; all of their bytes still pass the L2 at its measured bandwidth.

The step: eager PyTorch issues kernels from one host thread. The host pays a dispatch cost
per op (views too); a kernel starts when it has been issued and the previous kernel ended;
``.item()`` makes the host wait for the device. The step ends when both are done, so small
models and small batches come out host-bound, as they are in reality.

Results refer to what they time: an ``OpTime`` holds its ``OpCount`` (and through it the
``OpEvent``), a ``GemmTime`` the lowered ``Gemm`` it estimates, so no later table re-joins
them by event index.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from nnperf.errors import UsageError
from nnperf.hardware import GPU, DeviceProfile
from nnperf.kernels import batch_norm as bn_kernels
from nnperf.kernels import depthwise as dw_kernels
from nnperf.kernels import max_pool as pool_kernels
from nnperf.kernels.attention import (
    CUDNN,
    EFFICIENT,
    FLEX,
    FLEX_OPS,
    MATH,
    SdpaCall,
    efficient_uses_tensor_cores,
    math_attention,
    select_backend,
)
from nnperf.kernels.engines import PYTORCH, TRANSFORMER_ENGINE
from nnperf.kernels.gemm import GemmEstimate, estimate_gemm
from nnperf.kernels.grouped_gemm import GROUPED_MM, GroupedGemmEstimate, estimate_grouped_gemm
from nnperf.kernels.native_loops import LoopKernel, loop_kernel_time
from nnperf.kernels.rnn import cudnn_algorithm, estimate_rnn
from nnperf.passes.costs import norms as norm_costs
from nnperf.passes.costs import registry as cat
from nnperf.passes.costs import rnn as rnn_costs
from nnperf.passes.costs.matmul import (
    conv_geometry,
    input_channel_bytes,
    is_depthwise,
    nchw_transposes,
    winograd_fraction,
)
from nnperf.passes.count import OpCount
from nnperf.passes.fusion import FusedGroup, fused_groups
from nnperf.passes.gemms import Gemm, operand_dtype
from nnperf.passes.host_time import HostCosts
from nnperf.passes.kernel_calls import batch_norm_call, depthwise_call, max_pool_call
from nnperf.passes.l2_reuse import l2_read_hits
from nnperf.trace.events import KIND_OPT_STATE, OpEvent, Trace, dtype_name

#: The GEMMs of a linear layer that FP8 training runs in FP8: all three of training's.
FP8_ROLES = ("forward", "grad_input", "grad_weight")
#: Kernels of one per-tensor current-scaling cast: Transformer Engine's
#: (``Float8CurrentScalingQuantizer::quantize_impl``, ``transformer_engine/pytorch/csrc/
#: quantizer.cpp``: ``nvte_compute_amax``, ``nvte_compute_scale_from_amax``, ``nvte_quantize_v2``)
#: and torchao's (the absolute maximum's reduction, then the scaled cast).
FP8_CAST_KERNELS = {TRANSFORMER_ENGINE: 3, PYTORCH: 2}
_MEMORY_BOUND = {cat.ELEMENTWISE, cat.REDUCTION, cat.NORM, cat.MEMORY, cat.OPTIMIZER, "uncovered"}


@dataclass(frozen=True)
class TimingOptions:
    """Library switches that change which units run fp32 math (PyTorch's defaults)."""

    tf32_matmul: bool = False  # torch.backends.cuda.matmul.allow_tf32
    tf32_conv: bool = True  # torch.backends.cudnn.allow_tf32
    cudnn_benchmark: bool = False  # torch.backends.cudnn.benchmark


@dataclass(frozen=True, slots=True)
class GemmTime:
    """One lowered GEMM with its estimate on this GPU (the estimate is shared by every GEMM
    of the same shape: it is cached per shape)."""

    gemm: Gemm
    estimate: GemmEstimate


@dataclass(frozen=True)
class Fp8Casts:
    """The casts of an FP8 GEMM op's 16-bit operands (``KernelModel._fp8_casts``)."""

    bytes: float
    memory_s: float  # the bytes at the achievable bandwidth
    kernels: int
    overhead_s: float  # their kernels' overhead


@dataclass(slots=True, eq=False)
class OpTime:
    """One op's predicted time; what it is (index, op, module, phase, category, FLOPs,
    bytes) is its ``OpCount``'s."""

    count: OpCount = field(repr=False)
    kernels: int
    kernel_s: float  # predicted device time of the op's kernel(s)
    compute_s: float  # FLOPs / peak of the unit it runs on (roofline)
    # DRAM bytes / datasheet bandwidth (roofline); streaming ops and convolutions leave out the
    # reads found in L2 (passes.l2_reuse), GEMMs and attention count all their bytes
    memory_s: float
    peak_flops: float
    host_s: float  # host dispatch cost
    # The kernel model's terms, with the profile's efficiencies (tile and wave quantization,
    # achievable bandwidth): the larger of the two, unless the launch overhead exceeds both,
    # is what ``bound`` names, so tables show these beside it rather than the ideal terms.
    model_compute_s: float = 0.0
    model_memory_s: float = 0.0
    overhead_s: float = 0.0  # per-kernel launch overhead, the third term ``bound`` weighs
    layout_s: float = 0.0  # NCHW<->NHWC transposes around a tensor-core convolution (memory-bound)
    start_s: float = 0.0
    end_s: float = 0.0
    idle_before_s: float = 0.0  # device idle waiting for the host to issue this op
    # The host waits for the device before issuing it (a grouped GEMM's fallback reads its
    # offsets on the host first).
    host_sync: bool = False
    # The SDPA backend PyTorch picks on this GPU (flash, efficient, cudnn, math); "" otherwise.
    backend: str = ""
    bound: str = "none"  # what limits it in the step: compute | memory | launch | host | none
    kernel_bound: str = "none"  # what limits its kernel alone: compute | memory | launch
    # The rate its arithmetic ran at, e.g. "tf32" for an fp32 convolution with TF32 on,
    # "fp32" on CUDA cores; "" without FLOPs on a math unit (MFU's peak is built from it).
    math: str = ""
    math_unit: str = ""  # "tensor" or "cuda": the unit ``math`` ran on, where it ran on one
    gemms: list[GemmTime] = field(default_factory=list)
    # Ops this one kernel runs (``passes.fusion``): the group's first op carries its time, the
    # others none; 0 for an op run as written.
    fused_ops: int = 0

    @property
    def index(self) -> int:
        return self.count.index

    @property
    def op(self) -> str:
        return self.count.op

    @property
    def module(self) -> str:
        return self.count.module

    @property
    def phase(self) -> str:
        return self.count.phase

    @property
    def category(self) -> str:
        return self.count.category

    @property
    def wall_s(self) -> float:
        """Share of the device timeline: its kernels plus the idle gap it waited behind."""
        return self.kernel_s + self.idle_before_s

    def __repr__(self) -> str:
        return (f"OpTime({self.index}, {self.op!r}, module={self.module!r}, kernel_s={self.kernel_s:.3g}, "
                f"start_s={self.start_s:.6g}, bound={self.bound!s})")


@dataclass(frozen=True, slots=True)
class HostSlice:
    """One event's dispatch on the host thread (seconds from the start of the step)."""

    index: int
    name: str
    module: str
    phase: str
    start_s: float
    end_s: float
    launches: bool  # issues kernels (False: a view, metadata or host-only op)


@dataclass
class StepTime:
    ops: list[OpTime]
    step_s: float
    host_s: float  # when the host has issued the whole step: its waits at syncs included
    device_busy_s: float
    bound: str
    host_slices: list[HostSlice] = field(default_factory=list)  # every event, views included

    @property
    def device_idle_s(self) -> float:
        return self.step_s - self.device_busy_s

    @property
    def host_busy_s(self) -> float:
        """The host's time issuing the step: ``host_s`` less its waits for the device at syncs
        (a GradScaler's found-inf read, an expert all-to-all's splits), which are the device's
        time, not the host's work."""
        return issuing_time(self.host_slices)


def issuing_time(slices: list[HostSlice]) -> float:
    """The host's time in its slices: its work, without its waits at syncs between them."""
    return sum(s.end_s - s.start_s for s in slices)


class KernelModel:
    """Per-op kernel times on one GPU with one profile (GEMM estimates are cached)."""

    def __init__(self, gpu: GPU, profile: DeviceProfile, options: TimingOptions | None = None,
                 train: bool = False, l2_hits: dict[int, float] | None = None,
                 fp8_linears: frozenset[str] = frozenset(), cudnn_attention_first: bool = False,
                 fp8_cast_shares: dict[int, float] | None = None, attention_engine: str = PYTORCH,
                 linear_engine: str = PYTORCH, fp8_experts: bool = False,
                 fp8_recast_inputs: dict[int, int] | None = None, fp8_rowwise_casts: frozenset[int] = frozenset(),
                 fused_linears: dict[int, tuple[OpCount, ...]] | None = None):
        self.gpu = gpu
        self.profile = profile
        self.options = options or TimingOptions()
        self.train = train  # inputs require gradients (SDPA's backend checks read it)
        self.l2_hits = l2_hits or {}  # event index -> bytes read from L2 (passes.l2_reuse)
        if self.l2_hits and gpu.l2_reuse is None:
            raise ValueError(f"L2 hits given for {gpu.id}, which has no measured L2 (GPU.l2_reuse)")
        self._gemm_cache: dict[tuple, GemmEstimate] = {}
        # the linear layers whose GEMMs run in FP8 (``TraceOptions.fp8``: the trace names them)
        self.fp8_linears = fp8_linears
        # the share of its operand's cast an FP8 GEMM pays, where not all of it: event index ->
        # share (``trace.fp8_casts``: Megatron-LM's layouts)
        self.fp8_cast_shares = fp8_cast_shares or {}
        # SDPA with cuDNN's kernel first where it applies (``TraceOptions.sdpa == "cudnn"``)
        self.cudnn_attention_first = cudnn_attention_first
        # whose checks give it cuDNN: PyTorch's SDPA or Transformer Engine's (Megatron-LM's
        # layouts, ``trace.config["attention_engine"]``)
        self.attention_engine = attention_engine
        # whose linear layers the step runs: PyTorch's (``_grouped_mm`` for experts, torchao's
        # float8 casts) or Transformer Engine's (Megatron-LM's layouts: its FP8 casts,
        # GroupedLinear for experts), ``trace.config["linear_engine"]``
        self.linear_engine = linear_engine
        # the experts' grouped GEMMs run in FP8 (Transformer Engine's GroupedLinear under FP8:
        # Megatron-LM's layouts with --fp8, ``trace.config["fp8_experts"]``)
        self.fp8_experts = fp8_experts
        # FP8 GEMMs whose layer saved its 16-bit input rather than an FP8 copy
        # (``trace.fp8_saved_inputs``): backward ones that cast it again, column-wise (event
        # index -> elements), and forward ones whose cast writes it row-wise only
        self.fp8_recast_inputs = fp8_recast_inputs or {}
        self.fp8_rowwise_casts = fp8_rowwise_casts
        # traced GEMMs Transformer Engine runs as one (``trace.fused_expert_fc1``): the first
        # one's event index -> the group's counts, the first included; it times them all
        self.fused_linears = fused_linears or {}
        if (fp8_linears or fp8_experts) and "fp8" not in gpu.tensor_tflops:
            raise UsageError(f"--fp8: {gpu.name} has no FP8 tensor cores (Hopper, Ada Lovelace and "
                             "Blackwell GPUs have them); leave --fp8 out")
        self._vector_peak = gpu.peak_flops("fp32", tensor_cores=False, fallback=True)
        # what the L2 holds of a normalization's first sweep: its measured reuse capacity, else
        # the datasheet size (``_second_sweep_bytes``)
        self._l2_holds = gpu.l2_reuse[1] if gpu.l2_reuse else (gpu.l2_mb or 0.0) * 2**20

    def _traffic(self, count: OpCount, kernels: int = 1, reread: float = 0.0) -> tuple[float, float]:
        """(roofline memory term, modeled memory time) of the op's bytes plus ``reread`` bytes
        its kernels read again, in ``kernels`` equal kernels. The roofline term is its DRAM
        bytes (less the reads found in L2) at datasheet bandwidth; the modeled time is those
        bytes at the achievable bandwidth, or all bytes through the L2 at its measured
        bandwidth, whichever is longer."""
        dram_bytes = count.bytes + reread - self.l2_hits.get(count.index, 0.0)
        dram = kernels * self.profile.memory_time(self.gpu.memory_bandwidth, dram_bytes / kernels)
        if count.index in self.l2_hits:
            l2_bandwidth, _ = self.gpu.l2_reuse
            dram = max(dram, (count.bytes + reread) / l2_bandwidth)
        return dram_bytes / self.gpu.memory_bandwidth, dram

    def gemm(self, m: int, n: int, k: int, batch: int, dtype: str, tf32: bool) -> GemmEstimate:
        key = (m, n, k, batch, dtype, tf32)
        est = self._gemm_cache.get(key)
        if est is None:
            est = estimate_gemm(m, n, k, batch=batch, dtype=dtype, gpu=self.gpu, profile=self.profile, tf32=tf32)
            self._gemm_cache[key] = est
        return est

    def time_op(self, count: OpCount, host_s: float) -> OpTime:
        category = count.category
        base = dict(count=count, host_s=host_s)
        if count.op in rnn_costs.RNN_OPS:
            return self._rnn(count, base)
        if count.op == GROUPED_MM:
            return self._grouped(count, base)
        if category in (cat.GEMM, cat.CONV):
            return self._matrix(count, base)
        if category == cat.ATTENTION:
            return self._attention(count, base)
        if category == cat.NORM:
            call = batch_norm_call(count.event)
            if call is not None:
                return self._batch_norm(count, call, base)
        if count.op in (pool_kernels.FORWARD, pool_kernels.BACKWARD):
            call = max_pool_call(count.event)
            if call is not None and not call.channels_last:
                return self._max_pool(count, call, base)
        if category in (cat.ALLOC, cat.HOST, cat.COMMUNICATION):
            # no kernel on the compute stream (a collective runs on the communication
            # stream: passes.comm_timeline)
            return OpTime(kernels=0, kernel_s=0.0, compute_s=0.0, memory_s=0.0, peak_flops=0.0, **base)
        return self._streaming(count, base)

    def _matrix(self, count: OpCount, base: dict[str, Any]) -> OpTime:
        dtype = dtype_name(operand_dtype(count.event))
        is_conv = count.category == cat.CONV
        if is_conv and is_depthwise(count.event):
            return self._direct_conv(count, base)
        if not is_conv and self._runs_fp8(count, dtype):  # before its 16-bit GEMMs are estimated
            return self._fp8_linear(count, base)
        tf32 = self.options.tf32_conv if is_conv else self.options.tf32_matmul
        gemms = [GemmTime(g, self.gemm(g.m, g.n, g.k, g.batch, dtype, tf32)) for g in count.gemms]
        ests = [g.estimate for g in gemms]
        compute = sum(e.compute_s for e in ests)
        overhead = sum(e.overhead_s for e in ests)
        if is_conv:
            # Implicit GEMM gathers its A operand from the input tensor: traffic is the real
            # tensors (count.bytes), not the im2col matrix the GEMM shape implies. Each pass
            # runs at its class's efficiency relative to a cuBLAS GEMM of its shape.
            stride, positions = conv_geometry(count.event)
            channel_bytes = input_channel_bytes(count.event)
            model_compute = sum(
                e.model_compute_s * self._algorithm(count, g.gemm.role, e)
                / self.profile.conv_efficiency_of(stride, positions, g.gemm.role, e.math_unit, channel_bytes)
                for g, e in zip(gemms, ests, strict=True))
            memory, model_memory = self._traffic(count)
            reduction = sum(e.reduction_s for e in ests)
            # tensor-core kernels are NHWC: NCHW tensors are transposed in and out, each a
            # read and a write at the rate cuDNN's layout conversions reach (``transpose_time``),
            # one kernel each (memory traffic of their own, reported in the modeled memory term)
            measured_layouts = self.profile.layout_transpose_bytes_per_clock_sm > 0
            moved = (nchw_transposes(count.event, pointwise_native=measured_layouts)
                     if ests and ests[0].math_unit == "tensor" else [])
            transposes = len(moved)
            overhead += transposes * self.profile.kernel_overhead_s
            backward = count.op == "aten.convolution_backward"
            layout_s = sum(transpose_time(2 * b, self.gpu, self.profile, backward) for b in moved)
            kernel = max(model_compute, model_memory) + reduction + layout_s + overhead
            model_memory += layout_s
        else:
            transposes, layout_s = 0, 0.0
            memory = sum(e.memory_s for e in ests)
            model_compute = sum(e.model_compute_s for e in ests)
            model_memory = sum(e.model_memory_s for e in ests)
            kernel = sum(e.time_s for e in ests)
        bound = _bound(model_compute, model_memory, overhead)
        return OpTime(
            kernels=len(ests) + transposes, kernel_s=kernel, compute_s=compute, memory_s=memory,
            peak_flops=ests[0].peak_flops if ests else 0.0, bound=bound, gemms=gemms,
            math=ests[0].rate_dtype if ests else "",
            model_compute_s=model_compute, model_memory_s=model_memory, overhead_s=overhead,
            layout_s=layout_s, **base,
        )

    def _runs_fp8(self, count: OpCount, dtype: str) -> bool:
        return (count.event.module in self.fp8_linears and dtype in ("bf16", "fp16") and bool(count.gemms)
                and all(g.role in FP8_ROLES for g in count.gemms))

    def _fp8_linear(self, count: OpCount, base: dict[str, Any]) -> OpTime:
        """A linear layer's GEMM in FP8 with per-tensor current scaling, as Transformer Engine
        (``transformer_engine/pytorch/module/linear.py``, ``Float8CurrentScalingQuantizer``) and
        torchao's float8 run it:
        the GEMM at the FP8 tensor rate, after the 16-bit operand it brings is quantized
        (``FP8_CAST_KERNELS``: one kernel reads it for its absolute maximum, Transformer Engine's
        next computes the scale, the last reads it again and writes it in FP8), row-wise for
        this GEMM and, in training, column-wise too for the weight-gradient GEMM (Hopper's FP8
        GEMMs take only the "TN" layout), which therefore casts nothing. The forward GEMM brings its input, the input-gradient GEMM the output's
        gradient; the weight's cast, once per step, is not timed (``trace.capture``'s FP8
        assumption). In Megatron-LM's layouts a sequence-parallel operand is cast on the rank's
        shard, before its gather, and a fused layer's input once (``trace.fp8_casts``)."""
        gemms = [GemmTime(g, self.gemm(g.m, g.n, g.k, g.batch, "fp8", False)) for g in count.gemms]
        ests = [g.estimate for g in gemms]
        cast = self._fp8_casts(count)
        model_compute = sum(e.model_compute_s for e in ests)
        model_memory = sum(e.model_memory_s for e in ests) + cast.memory_s
        overhead = sum(e.overhead_s for e in ests) + cast.overhead_s
        return OpTime(
            kernels=len(ests) + cast.kernels,
            kernel_s=sum(e.time_s for e in ests) + cast.memory_s + cast.overhead_s,
            compute_s=sum(e.compute_s for e in ests),
            memory_s=sum(e.memory_s for e in ests) + cast.bytes / self.gpu.memory_bandwidth,
            peak_flops=ests[0].peak_flops, bound=_bound(model_compute, model_memory, overhead), gemms=gemms,
            math="fp8", model_compute_s=model_compute, model_memory_s=model_memory, overhead_s=overhead, **base,
        )

    def _rnn(self, count: OpCount, base: dict[str, Any]) -> OpTime:
        """A cuDNN RNN call (``kernels.rnn``): its big GEMMs, then its recurrence step by step
        with the GEMM model, chains side by side where they fit; fp32 under TF32 when
        ``torch.backends.cudnn.allow_tf32`` (cuDNN's default math)."""
        dtype = dtype_name(operand_dtype(count.event))
        geometry = rnn_costs.geometry(count.event)
        forward = count.op == rnn_costs.FORWARD_OP
        algorithm = cudnn_algorithm(geometry, dtype, self.gpu, forward)
        tf32 = self.options.tf32_conv

        def gemm(m: int, n: int, k: int) -> GemmEstimate:
            return self.gemm(m, n, k, 1, dtype, tf32)

        itemsize = operand_dtype(count.event).itemsize
        parts = [estimate_rnn(geometry, part, itemsize, algorithm, self.gpu, self.profile, gemm)
                 for part in rnn_costs.parts(count.event)]
        by_shape = {(g.m, g.n, g.k): e for p in parts for g, e in p.gemms}
        gemms = [GemmTime(g, by_shape[(g.m, g.n, g.k)]) for g in count.gemms]
        first = gemms[0].estimate if gemms else None
        compute = sum(g.estimate.compute_s for g in gemms)
        memory = count.bytes / self.gpu.memory_bandwidth
        model_compute = sum(p.compute_s for p in parts)
        model_memory = sum(p.memory_s for p in parts)
        overhead = sum(p.overhead_s for p in parts)
        return OpTime(
            kernels=sum(p.kernels for p in parts), kernel_s=sum(p.time_s for p in parts),
            compute_s=compute, memory_s=memory, peak_flops=first.peak_flops if first else 0.0,
            bound=_bound(model_compute, model_memory, overhead), gemms=gemms,
            math=first.rate_dtype if first else "", model_compute_s=model_compute,
            model_memory_s=model_memory, overhead_s=overhead, **base,
        )

    def _grouped(self, count: OpCount, base: dict[str, Any]) -> OpTime:
        """A grouped GEMM (``kernels.grouped_gemm``): CUTLASS's one-launch grouped kernel where
        PyTorch takes it, else one GEMM per group after the offsets are read on the host;
        Transformer Engine's GEMMs per group over its four compute streams in Megatron-LM's
        layouts, where the experts' gate and up projections are one layer: the traced pair timed
        on its first GEMM at their summed width (``trace.fused_expert_fc1``, ``fused_shapes``).
        Each group's GEMM is listed with its share of the kernel's time."""
        dtype = dtype_name(operand_dtype(count.event))
        if self.fp8_experts and self.linear_engine == TRANSFORMER_ENGINE and dtype in ("bf16", "fp16"):
            return self._fp8_grouped(count, base)
        members = self.fused_linears.get(count.event.index, (count,))
        a, b = count.event.args[0], count.event.args[1]
        est = estimate_grouped_gemm(
            fused_shapes(members), dtype=dtype, gpu=self.gpu, profile=self.profile,
            min_bytes=fused_bytes(members, lambda c: c.bytes),
            tf32=self.options.tf32_matmul, batched=len(a.shape) == 3 and len(b.shape) == 3,
            engine=self.linear_engine)
        gemms = [GemmTime(g, self._group_share(g, est)) for c in members for g in c.gemms]
        return OpTime(
            kernels=est.kernels, kernel_s=est.time_s, compute_s=est.compute_s, memory_s=est.memory_s,
            peak_flops=est.peak_flops, bound=_bound(est.model_compute_s, est.model_memory_s, est.overhead_s),
            gemms=gemms, math=est.rate_dtype, model_compute_s=est.model_compute_s,
            model_memory_s=est.model_memory_s, overhead_s=est.overhead_s, host_sync=est.host_sync, **base,
        )

    def _fp8_grouped(self, count: OpCount, base: dict[str, Any]) -> OpTime:
        """The experts' GEMMs in FP8 as Transformer Engine's ``GroupedLinear`` runs them under
        FP8 with per-tensor current scaling (``transformer_engine/pytorch/module/
        grouped_linear.py``): the 16-bit operand each expert's GEMM brings is split by expert and
        quantized expert by expert (``split_quantize`` -> ``multi_tensor_quantize_impl``: one
        quantizer call per split where the scaling is not delayed), each as ``_fp8_linear``'s
        cast (its kernels, its bytes: read for the absolute maximum, read again and written
        row-wise and, in training, column-wise), then the GEMMs at the FP8 tensor rate over TE's
        four streams (``kernels.grouped_gemm``), reading one-byte operands. The gate and up
        projections are one GroupedLinear in Megatron-Core (``linear_fc1``): the traced pair is
        timed on its first GEMM as one GEMM an expert (``trace.fused_expert_fc1``), the second
        reusing the first's forward cast (``trace.fp8_casts``); in backward the fused layer's
        output gradient, both members' rows, is cast once an expert."""
        members = self.fused_linears.get(count.event.index, (count,))

        def operand_bytes(c: OpCount) -> float:  # one-byte operands, the output as traced
            a, b = c.event.args[0], c.event.args[1]
            return float(a.numel + b.numel + c.event.outputs[0].nbytes)

        est = estimate_grouped_gemm(
            fused_shapes(members), dtype="fp8", gpu=self.gpu, profile=self.profile,
            min_bytes=fused_bytes(members, operand_bytes, operand_itemsize=1), engine=self.linear_engine)
        cast = self._fp8_casts(count)
        if len(members) > 1:  # the fused layer's operand, cast once an expert: the members' bytes
            extra = sum(self._fp8_casts(c).bytes for c in members[1:])
            nbytes = cast.bytes + extra
            cast = replace(cast, bytes=nbytes, memory_s=self.profile.memory_time(self.gpu.memory_bandwidth, nbytes))
        gemms = [GemmTime(g, self._group_share(g, est, "fp8")) for c in members for g in c.gemms]
        model_memory = est.model_memory_s + cast.memory_s
        overhead = est.overhead_s + cast.overhead_s
        return OpTime(
            kernels=est.kernels + cast.kernels, kernel_s=est.time_s + cast.memory_s + cast.overhead_s,
            compute_s=est.compute_s, memory_s=est.memory_s + cast.bytes / self.gpu.memory_bandwidth,
            peak_flops=est.peak_flops, bound=_bound(est.model_compute_s, model_memory, overhead), gemms=gemms,
            math="fp8", model_compute_s=est.model_compute_s, model_memory_s=model_memory, overhead_s=overhead,
            host_sync=est.host_sync, **base,
        )

    def _fp8_casts(self, count: OpCount) -> Fp8Casts:
        """The per-tensor casts an FP8 GEMM op pays (``_fp8_linear``), one per GEMM that brings a
        16-bit operand (not the weight gradient's), at the op's share (``trace.fp8_casts``: 0
        for a fused layer's input cast already): read for the absolute maximum, read again,
        written row-wise and, in training, column-wise; ``FP8_CAST_KERNELS`` each. A layer that
        saved its 16-bit input (``trace.fp8_saved_inputs``) writes its forward cast row-wise
        only, and its weight-gradient GEMM casts that input again, column-wise."""
        itemsize = 2  # the 16-bit operand (``_runs_fp8``)
        index = count.event.index
        # FP8 bytes written per element: row-wise and, for a saved FP8 copy, column-wise
        written = 2 if self.train and index not in self.fp8_rowwise_casts else 1
        share = self.fp8_cast_shares.get(index, 1.0)
        cast = [g.m * g.k * g.batch * (2 * itemsize + written) * share for g in count.gemms
                if g.role != "grad_weight" and share]
        if index in self.fp8_recast_inputs:  # the saved original, column-wise
            cast.append(self.fp8_recast_inputs[index] * (2 * itemsize + 1))
        nbytes = float(sum(cast))
        kernels = FP8_CAST_KERNELS[self.linear_engine] * len(cast)
        return Fp8Casts(nbytes, self.profile.memory_time(self.gpu.memory_bandwidth, nbytes), kernels,
                        kernels * self.profile.kernel_overhead_s)

    def _group_share(self, g: Gemm, est: GroupedGemmEstimate, dtype: str | None = None) -> GemmEstimate:
        """One group's GEMM as a ``GemmEstimate`` holding its share (by FLOPs) of the grouped
        kernel's time, so tables that sum GEMM times add up to the op's (in ``dtype``, where the
        kernels run in another than the trace's)."""
        share = g.flops / est.flops if est.flops else 0.0
        one = self.gemm(g.m, g.n, g.k, 1, dtype or g.dtype, self.options.tf32_matmul)
        return replace(one, time_s=est.time_s * share, model_compute_s=est.model_compute_s * share,
                       model_memory_s=est.model_memory_s * share, overhead_s=est.overhead_s * share)

    @staticmethod
    def _algorithm(count: OpCount, role: str | None, estimate: GemmEstimate) -> float:
        """Compute-time factor of the algorithm cuDNN runs instead of the implicit GEMM: fused
        Winograd for CUDA-core 3x3 forward and data-gradient convolutions when it does fewer
        multiplies (``passes.costs.matmul.winograd_fraction``), else 1."""
        if estimate.math_unit != "cuda" or role == "grad_weight":
            return 1.0
        fraction = winograd_fraction(count.event)
        return min(1.0, fraction) if fraction is not None else 1.0

    def _direct_conv(self, count: OpCount, base: dict[str, Any]) -> OpTime:
        """A depthwise convolution's direct kernels (``kernels.depthwise``): each tap loop at
        the profile's measured rate for its kernel family (``depthwise_rate``), never faster
        than its bytes at the achievable bandwidth; PyTorch's NCHW weight gradient as the
        latency-bound loop it is (``kernels.native_loops``). cuDNN's gradient passes are
        each one forward's taps. Without a rate for the family (or a call of another rank), the
        op's tensors once through DRAM or its FMAs on the CUDA cores, whichever is longer."""
        call = depthwise_call(count.event)
        rate = dw_kernels.rate(call, self.gpu, self.profile) if call is not None else None
        if call is None or rate is None:
            return self._direct_conv_roofline(count, base)
        grad_output = count.event.args[0] if call.backward else None
        x = count.event.args[1] if call.backward else count.event.args[0]
        loops: list[LoopKernel] = []
        tap_s = 0.0
        kernels = 0
        if not call.backward:
            tap_s = max(call.output_macs / rate, self.profile.memory_time(self.gpu.memory_bandwidth, count.bytes))
            kernels = 1
        elif call.path == "native":
            if call.want_input_grad:  # reads dy, writes dx
                moved = grad_output.nbytes + x.nbytes
                tap_s += max(call.input_taps / rate, self.profile.memory_time(self.gpu.memory_bandwidth, moved))
                kernels += 1
            if call.want_weight_grad:
                loops.append(dw_kernels.grad_weight_loop(call, grad_output.nbytes, x.nbytes))
        else:
            for wanted in (call.want_input_grad, call.want_weight_grad):
                if wanted:  # each cuDNN gradient pass reads dy and one more tensor
                    moved = grad_output.nbytes + x.nbytes
                    tap_s += max(call.output_macs / rate, self.profile.memory_time(self.gpu.memory_bandwidth, moved))
                    kernels += 1
        loop_s = sum(loop_kernel_time(k, self.gpu, self.profile) for k in loops)
        kernels += len(loops)
        overhead = kernels * self.profile.kernel_overhead_s
        model_compute = tap_s  # instruction-bound tap loops
        model_memory = loop_s  # latency-bound weight-gradient loops
        return OpTime(
            kernels=kernels, kernel_s=model_compute + model_memory + overhead,
            compute_s=count.flops / self._vector_peak, memory_s=count.bytes / self.gpu.memory_bandwidth,
            peak_flops=self._vector_peak, math="fp32" if count.flops else "",
            bound=_bound(model_compute, model_memory, overhead), model_compute_s=model_compute,
            model_memory_s=model_memory, overhead_s=overhead, **base,
        )

    def _direct_conv_roofline(self, count: OpCount, base: dict[str, Any]) -> OpTime:
        """A depthwise convolution without a measured rate: its tensors once through DRAM at
        the achievable bandwidth, or its FMAs on the CUDA cores in fp32 (the kernels'
        accumulate type), whichever is longer; one kernel per gradient in backward, each
        reading the output gradient (so with both it is read twice)."""
        kernels = max(1, len(count.gemms))
        grad_output = count.event.args[0]
        reread = (kernels - 1) * grad_output.nbytes if count.op == "aten.convolution_backward" else 0.0
        memory, model_memory = self._traffic(count, reread=reread)
        model_compute = count.flops / (self._vector_peak * self.profile.cuda_core_fraction)
        overhead = kernels * self.profile.kernel_overhead_s
        return OpTime(
            kernels=kernels,
            kernel_s=max(model_compute, model_memory) + overhead,
            compute_s=count.flops / self._vector_peak,
            memory_s=memory,
            peak_flops=self._vector_peak,
            math="fp32" if count.flops else "",
            bound=_bound(model_compute, model_memory, overhead),
            model_compute_s=model_compute,
            model_memory_s=model_memory,
            overhead_s=overhead,
            **base,
        )

    def _attention(self, count: OpCount, base: dict[str, Any]) -> OpTime:
        """A fused attention kernel: executed FLOPs (flash and memory-efficient backward
        recompute Q@K^T) at the profile's attention fraction of the rate its backend computes
        at (the memory-efficient kernel at ``efficient_attention_forward_scale`` / ``_backward_scale``
        of flash's fraction,
        FlexAttention's at ``flex_attention_forward_scale`` / ``_backward_scale`` of it, over the
        pairs of the blocks it computes; either at its ``wide_head_attention`` share above head
        dim 128), bounded by its bytes. An SDPA call
        (``nnperf.attention``) first gets the backend PyTorch would pick on this GPU (``kernels.attention.select_backend``;
        cuDNN's at ``cudnn_attention_forward_scale`` / ``_backward_scale`` of flash's fraction); the math
        fallback is timed as the GEMMs and elementwise kernels it runs."""
        event = count.event
        backward = count.op.endswith("_backward")
        call = _sdpa_call(event, backward, self.train)
        backend = (select_backend(call, self.gpu, cudnn_first=self.cudnn_attention_first,
                                  engine=self.attention_engine) if call is not None
                   else FLEX if count.op in FLEX_OPS else "")
        if backend == MATH:
            return self._math_attention(count, call, backward, base)
        dtype = dtype_name(event.inputs[1].dtype if count.phase == "backward" else event.inputs[0].dtype)
        rate = self.gpu.matmul_peak(dtype, tf32=self.options.tf32_matmul, fallback=True)
        peak, math, unit = rate.flops, rate.dtype, rate.unit
        if backend == EFFICIENT and dtype == "fp32" and efficient_uses_tensor_cores(dtype, self.gpu):
            # the memory-efficient kernel's fp32 GEMMs on sm80+ are 3xTF32 (three TF32 MMAs
            # per product, OpMultiplyAddFastF32: DefaultGemmType in mem_eff_attention's
            # gemm_kernel_utils.h), whatever torch.backends.cuda.matmul.allow_tf32 says
            peak, math, unit = self.gpu.peak("tf32", fallback=True).flops / 3, "3xtf32", "tensor"
        fraction = (
            self.profile.attention_backward_fraction if backward else self.profile.attention_forward_fraction
        )
        if backend == EFFICIENT:
            fraction *= (self.profile.efficient_attention_backward_scale if backward  # the CUTLASS kernel
                         else self.profile.efficient_attention_forward_scale)  # against flash
        elif backend == CUDNN:  # cuDNN's fused kernel against flash
            fraction *= (self.profile.cudnn_attention_backward_scale if backward
                         else self.profile.cudnn_attention_forward_scale)
        elif backend == FLEX:  # inductor's Triton template against flash
            fraction *= (self.profile.flex_attention_backward_scale if backward
                         else self.profile.flex_attention_forward_scale)
        # query/key heads wider than the measured 128 (latent attention's 192)
        head_dim = call.head_dim if call is not None else event.args[0].shape[-1]
        fraction *= self.profile.attention_head_scale(backend, backward, head_dim)
        # a block-sparse kernel computes every pair of its non-empty blocks (FlexAttention)
        executed = count.info.get("executed_flops", count.flops) + count.info.get("recompute_flops", 0.0)
        model_compute = executed / (peak * fraction)
        model_memory = self.profile.memory_time(self.gpu.memory_bandwidth, count.bytes)
        overhead = self.profile.kernel_overhead_s
        return OpTime(
            kernels=1,
            kernel_s=max(model_compute, model_memory) + overhead,
            compute_s=count.flops / peak,
            memory_s=count.bytes / self.gpu.memory_bandwidth,
            peak_flops=peak,
            math=math,
            math_unit=unit,
            bound=_bound(model_compute, model_memory, overhead),
            model_compute_s=model_compute,
            model_memory_s=model_memory,
            overhead_s=overhead,
            backend=backend,
            **base,
        )

    def _math_attention(self, count: OpCount, call: SdpaCall, backward: bool, base: dict[str, Any]) -> OpTime:
        """SDPA's math backend (``kernels.attention.math_attention``): its batched GEMMs with
        the GEMM model over every (query, key) pair (a causal mask is applied after them), and
        each elementwise pass over the score matrix at the achievable bandwidth."""
        work = math_attention(call, backward)
        ests = [self.gemm(m, n, k, b, call.dtype, self.options.tf32_matmul) for m, n, k, b in work.gemms]
        itemsize = count.event.inputs[0].itemsize
        pass_bytes = 2 * work.score_elements * itemsize  # each pass reads and writes the matrix
        passes_s = work.score_passes * (self.profile.memory_time(self.gpu.memory_bandwidth, pass_bytes)
                                        + self.profile.kernel_overhead_s)
        model_compute = sum(e.model_compute_s for e in ests)
        model_memory = sum(e.model_memory_s for e in ests) + work.score_passes * self.profile.memory_time(
            self.gpu.memory_bandwidth, pass_bytes)
        overhead = (len(ests) + work.score_passes) * self.profile.kernel_overhead_s
        return OpTime(
            kernels=len(ests) + work.score_passes,
            kernel_s=sum(e.time_s for e in ests) + passes_s,
            compute_s=sum(e.compute_s for e in ests),
            memory_s=(count.bytes + work.score_passes * pass_bytes) / self.gpu.memory_bandwidth,
            peak_flops=ests[0].peak_flops, math=ests[0].rate_dtype, math_unit=ests[0].math_unit,
            bound=_bound(model_compute, model_memory, overhead),
            model_compute_s=model_compute, model_memory_s=model_memory, overhead_s=overhead,
            backend=MATH, **base,
        )

    def _second_sweep_bytes(self, count: OpCount) -> float:
        """DRAM bytes of a normalization's second sweep over its inputs
        (``passes.costs.norms.second_reads``): all of them when the first sweep's bytes exceed
        the L2 (its measured reuse capacity, else the datasheet size), none when the L2 still
        holds them. The whole first sweep is the reuse distance of its first element: an upper
        bound of the LRU stack distance, as in ``passes.l2_reuse``."""
        if count.category != cat.NORM:
            return 0.0
        sweep = float(sum(t.nbytes for t in norm_costs.second_reads(count.event)))
        return sweep if sweep > self._l2_holds else 0.0

    def _batch_norm(self, count: OpCount, call: bn_kernels.BatchNormCall, base: dict[str, Any]) -> OpTime:
        """A batch norm as the backend PyTorch picks runs it (``kernels.batch_norm``): cuDNN's
        and the native channels-last kernels stream the op's bytes (a second sweep where the
        first overflowed the L2); the native NCHW kernels are per-thread loops whose time is
        their iterations' round trips (``kernels.native_loops``), plus the small kernels over
        per-channel vectors beside them."""
        rank = len(count.event.args[1 if call.backward else 0].shape)
        plan = bn_kernels.launches(call, bn_kernels.uses_cudnn(call, rank))
        if plan.streamed and not plan.loops:
            t = self._streaming(count, base, kernels=plan.streamed)
            extra = plan.small * self.profile.kernel_overhead_s
            t.kernels += plan.small
            t.kernel_s += extra
            t.overhead_s += extra
            return t
        return self._loops(count, plan.loops, plan.streamed + plan.small, base)

    def _max_pool(self, count: OpCount, call: pool_kernels.MaxPoolCall, base: dict[str, Any]) -> OpTime:
        """NCHW max pooling (``kernels.max_pool``): the window loop of the forward, or the
        backward's zero fill of the input gradient (a streaming write) and its loop over the
        outputs covering each input element."""
        t = self._loops(count, [pool_kernels.nchw_loop(call)], 0, base)
        if call.backward:  # gradInput.zero_()
            fill = self.profile.memory_time(self.gpu.memory_bandwidth, count.event.outputs[0].nbytes)
            t.kernels += 1
            t.model_memory_s += fill
            t.overhead_s += self.profile.kernel_overhead_s
            t.kernel_s += fill + self.profile.kernel_overhead_s
        return t

    def _loops(self, count: OpCount, loops: tuple[LoopKernel, ...] | list[LoopKernel], others: int,
               base: dict[str, Any]) -> OpTime:
        """An op run as per-thread loop kernels (``kernels.native_loops``) and ``others`` kernels
        charged their launch only (the loops' bytes carry the op's traffic). The loops' time is
        memory time (latency or bandwidth), reported as the modeled memory term."""
        memory = count.bytes / self.gpu.memory_bandwidth
        model_memory = sum(loop_kernel_time(k, self.gpu, self.profile) for k in loops)
        model_compute = count.flops / (self._vector_peak * self.profile.cuda_core_fraction)
        kernels = len(loops) + others
        overhead = kernels * self.profile.kernel_overhead_s
        return OpTime(
            kernels=kernels, kernel_s=max(model_compute, model_memory) + overhead,
            compute_s=count.flops / self._vector_peak, memory_s=memory, peak_flops=self._vector_peak,
            bound=_bound(model_compute, model_memory, overhead), model_compute_s=model_compute,
            model_memory_s=model_memory, overhead_s=overhead, **base,
        )

    def fused_group(self, count: OpCount, group: FusedGroup, host_s: float) -> OpTime:
        """A group of pointwise ops run as one kernel (``passes.fusion``), on its first op's
        count: its external bytes at the achievable bandwidth, or its FLOPs on the CUDA cores,
        and one launch."""
        model_memory = self.profile.memory_time(self.gpu.memory_bandwidth, group.bytes)
        model_compute = group.flops / (self._vector_peak * self.profile.cuda_core_fraction)
        overhead = self.profile.kernel_overhead_s
        return OpTime(
            count=count,
            host_s=host_s,
            kernels=1,
            kernel_s=max(model_compute, model_memory) + overhead,
            compute_s=group.flops / self._vector_peak,
            memory_s=group.bytes / self.gpu.memory_bandwidth,
            peak_flops=self._vector_peak,
            bound=_bound(model_compute, model_memory, overhead),
            model_compute_s=model_compute,
            model_memory_s=model_memory,
            overhead_s=overhead,
            fused_ops=len(group.members),
        )

    def _streaming(self, count: OpCount, base: dict[str, Any], kernels: int | None = None) -> OpTime:
        """Bytes at the achievable bandwidth (or FLOPs on the CUDA cores) in ``kernels`` equal
        kernels: by default one, or one per ``foreach_tensors_per_kernel`` tensors of a foreach op."""
        if kernels is None:
            tensors = int(count.info.get("tensors", 1))
            kernels = max(1, math.ceil(tensors / self.profile.foreach_tensors_per_kernel))
        memory, model_memory = self._traffic(count, kernels, reread=self._second_sweep_bytes(count))
        model_compute = count.flops / (self._vector_peak * self.profile.cuda_core_fraction)
        overhead = kernels * self.profile.kernel_overhead_s
        return OpTime(
            kernels=kernels,
            kernel_s=max(model_compute, model_memory) + overhead,
            compute_s=count.flops / self._vector_peak,
            memory_s=memory,
            peak_flops=self._vector_peak,
            bound=_bound(model_compute, model_memory, overhead),
            model_compute_s=model_compute,
            model_memory_s=model_memory,
            overhead_s=overhead,
            **base,
        )


def transpose_time(moved: float, gpu: GPU, profile: DeviceProfile, backward: bool = False) -> float:
    """Seconds of a cuDNN layout conversion reading and writing ``moved`` bytes in all: for a
    forward pass at ``layout_transpose_bytes_per_clock_sm`` per SM and boost clock where
    measured (the H200's conversions ran at a quarter of its DRAM bandwidth, so the SMs, not
    DRAM, set their pace), never faster than the achievable DRAM bandwidth; at that bandwidth
    where not measured (0) and for the gradients' conversions, which no microbenchmark has
    timed yet (``validation/kernel_bench.py`` does). Where measured, the forward pass of a
    pointwise convolution converts nothing (``passes.costs.matmul.nchw_transposes``), as the
    same calibration found."""
    dram = profile.memory_time(gpu.memory_bandwidth, moved)
    per_clock = profile.layout_transpose_bytes_per_clock_sm
    if per_clock <= 0 or backward:
        return dram
    return max(moved / (per_clock * gpu.sm_count * gpu.boost_clock_mhz * 1e6), dram)


def _sdpa_call(event: OpEvent, backward: bool, train: bool) -> SdpaCall | None:
    """What SDPA's backend checks read, from an ``nnperf.attention`` event (forward: q, k, v,
    mask, dropout_p, is_causal, scale, enable_gqa; backward: grad_out first, then q, k, v,
    out, lse, mask, dropout_p, is_causal, scale, enable_gqa); None for other attention ops."""
    if event.name not in ("nnperf.attention", "nnperf.attention_backward"):
        return None
    a = event.args[1:] if backward else event.args
    q, k, v, mask = a[0], a[1], a[2], a[5] if backward else a[3]
    dropout, causal, gqa = (a[6], a[7], a[9]) if backward else (a[4], a[5], a[7])
    if len(q.shape) != 4 or len(k.shape) != 4 or len(v.shape) != 4:  # check_tensor_shapes
        return None
    return SdpaCall(
        dtype=dtype_name(q.dtype), batch=q.shape[0], heads_q=q.shape[1], heads_kv=k.shape[1],
        q_len=q.shape[2], kv_len=k.shape[2], head_dim=q.shape[3], head_dim_k=k.shape[3],
        head_dim_v=v.shape[3], has_mask=mask is not None, dropout=float(dropout), causal=bool(causal),
        enable_gqa=bool(gqa), requires_grad=train or backward, strides=(q.stride, k.stride, v.stride),
    )


def fused_shapes(members: tuple[OpCount, ...]) -> list[tuple[int, int, int]]:
    """The per-group GEMMs of grouped GEMMs run as one layer (``trace.fused_expert_fc1``): each
    group's output features summed over the members, where the role puts them: the forward's
    N, the weight gradient's M, the input gradient's contraction K."""
    if len(members) == 1:
        return [(g.m, g.n, g.k) for g in members[0].gemms]
    per_group = list(zip(*(c.gemms for c in members), strict=True))
    role = members[0].gemms[0].role
    if role == "grad_weight":
        return [(sum(g.m for g in gs), gs[0].n, gs[0].k) for gs in per_group]
    if role == "grad_input":
        return [(gs[0].m, gs[0].n, sum(g.k for g in gs)) for gs in per_group]
    return [(gs[0].m, sum(g.n for g in gs), gs[0].k) for gs in per_group]


def fused_bytes(members: tuple[OpCount, ...], bytes_of: Callable[[OpCount], float],
                operand_itemsize: int | None = None) -> float:
    """The bytes of grouped GEMMs run as one layer: the members' less what they share, once
    each beyond the first: the forward's input, the weight gradient's saved input (read at
    ``operand_itemsize`` bytes an element where given, else as traced), the input gradient's
    output (one sum written where the members write one each)."""
    total = sum(bytes_of(c) for c in members)
    if len(members) == 1:
        return total
    first = members[0]
    role = first.gemms[0].role
    if role == "grad_input":
        shared = float(first.event.outputs[0].nbytes)
    else:
        operand = first.event.args[0] if role != "grad_weight" else first.event.args[1]
        shared = float(operand.numel * operand_itemsize if operand_itemsize else operand.nbytes)
    return total - shared * (len(members) - 1)


def _bound(compute: float, memory: float, overhead: float) -> str:
    if overhead >= max(compute, memory):
        return "launch"
    return "compute" if compute >= memory else "memory"


#: Ops whose output size the host must read from the device: "When input is on CUDA,
#: torch.nonzero() causes host-device synchronization" (``torch.nonzero`` documentation).
_SIZE_SYNCS = frozenset({"aten.nonzero", "aten.argwhere"})


def _host_value_op(event: OpEvent, trace: Trace) -> bool:
    """An op on values the host holds (``.item()`` of the optimizer's step counters, which a
    GPU run keeps on the host): host work only, like a view."""
    return event.name == "aten._local_scalar_dense" and not _syncs(event, trace)


def _syncs(event: OpEvent, trace: Trace) -> bool:
    """``.item()`` waits for the device, except on the optimizer's step counters, which a
    GPU run keeps on the host (PyTorch's non-capturable Adam/AdamW); so does ``nonzero``."""
    if event.name in _SIZE_SYNCS:
        return True
    if event.name != "aten._local_scalar_dense":
        return False
    src = event.inputs[0] if event.inputs else None
    on_host = src is not None and not src.shape and (
        event.phase == "optimizer" or trace.storages[src.storage].kind == KIND_OPT_STATE
    )
    return not on_host


def simulate_step(
    trace: Trace, counts: list[OpCount], gpu: GPU, profile: DeviceProfile, options: TimingOptions | None = None
) -> StepTime:
    """Play the eager timeline: host issues ops in order, the device runs them in order.

    The host's time per event is its parts' (``passes.host_time``): the op's dispatch from
    Python or C++, the autograd node it records, the module calls before it, the backward
    node it runs in; the optimizer's step as a whole where the host has it measured (spread
    over its ops); ``zero_grad`` after the optimizer."""
    reuse = gpu.l2_reuse
    hits = l2_read_hits(counts, reuse[1]) if reuse else None
    groups = fused_groups(trace, counts)
    # GEMMs Transformer Engine runs as one layer (``trace.fused_expert_fc1``), timed on their
    # first; the others, and the adds that only sum their input gradients, run nothing (an add
    # run inside a fused pointwise group stays, and so do the GEMMs whose results it sums)
    by_index = {c.event.index: c for c in counts}
    sums = trace.config.get("fused_sums", {})
    unfused = {first for add, first in sums.items() if add in groups}
    fused_linears = {first: tuple(by_index[i] for i in members)
                     for first, members in trace.config.get("fused_linears", {}).items() if first not in unfused}
    fused_away = ({c.event.index for members in fused_linears.values() for c in members[1:]}
                  | {add for add, first in sums.items() if first in fused_linears})
    model = KernelModel(gpu, profile, options, train=trace.mode == "train", l2_hits=hits,
                        fp8_linears=frozenset(trace.config.get("fp8_linears", ())),
                        fp8_cast_shares=trace.config.get("fp8_cast_shares"),
                        cudnn_attention_first=trace.config.get("options", {}).get("sdpa") == "cudnn",
                        attention_engine=trace.config.get("attention_engine", PYTORCH),
                        linear_engine=trace.config.get("linear_engine", PYTORCH),
                        fp8_experts=bool(trace.config.get("fp8_experts")),
                        fp8_recast_inputs=trace.config.get("fp8_recast_inputs"),
                        fp8_rowwise_casts=frozenset(trace.config.get("fp8_rowwise_casts", ())),
                        fused_linears=fused_linears)
    costs = HostCosts.of(profile)
    step_options = trace.config.get("options", {})
    autocast = bool(step_options.get("amp"))
    optimizer_events = [e for e in trace.events if e.phase == "optimizer"]
    measured_optimizer = (costs.optimizer(step_options.get("optimizer", ""), step_options.get("optimizer_impl", ""))
                          if optimizer_events else None)
    params = len(trace.param_storages)
    optimizer_share = (measured_optimizer.seconds(params) / len(optimizer_events)
                       if measured_optimizer is not None else 0.0)
    # torch.compile runs the fused blocks where PyTorch's layers do (Transformer Engine's layers
    # are eager modules with fused kernels of their own): their ops are issued as Inductor's
    # wrapper issues them, one backward node a block call (``HostCosts.compiled_event_s``)
    compiled = bool(trace.config.get("fused_blocks")) and trace.config.get("linear_engine", PYTORCH) == PYTORCH
    pending = iter(counts)  # counts are the trace's non-free events, in trace order
    count = next(pending, None)
    host = device = busy = 0.0
    node = -1  # the backward node whose ops the host is dispatching
    block_call = -1  # the compiled block's call whose forward the host is issuing
    blocks_backward: set[int] = set()  # the compiled block calls whose backward node has run
    in_backward = False
    ops: list[OpTime] = []
    slices: list[HostSlice] = []
    for event in trace.events:
        counted = count is not None and count.event is event
        group = groups.get(event.index) if counted else None
        in_block = compiled and event.block_call >= 0
        call_s = 0.0  # a compiled block's call or backward node, whichever of its ops opens it
        if measured_optimizer is not None and event.phase == "optimizer":
            cost = optimizer_share + costs.subclass_s(event)  # measured on plain tensors
        elif in_block:
            cost = costs.compiled_event_s(count.category if counted else None)
            if event.phase != "backward" and event.block_call != block_call:
                call_s = costs.compiled_call_s()
            elif event.phase == "backward" and event.block_call not in blocks_backward:
                blocks_backward.add(event.block_call)  # one node runs the call's whole backward
                call_s = costs.node_s()
        else:
            cost = costs.event_s(event, count.category if counted else None,
                                 host_value=counted and _host_value_op(event, trace),
                                 autocast=autocast and event.phase == "forward")
        block_call = event.block_call if event.phase != "backward" else -1
        if event.phase == "backward" and not in_backward:  # backward() hands the graph to the engine
            in_backward = True
            cost += costs.backward_call_s
        elif event.phase != "backward":
            in_backward = False
        if not in_block and event.backward_node >= 0 and event.backward_node != node:
            node = event.backward_node
            cost += costs.node_s()
        cost += call_s
        issued = host
        if not counted:  # a view: host time only
            host += cost
            slices.append(HostSlice(event.index, event.name, event.module, event.phase, issued, host, False))
            continue
        if group is None and event.index not in fused_away:
            t = model.time_op(count, cost)
        elif group is not None and group.first == event.index:
            t = model.fused_group(count, group, cost)
        else:
            # run by its group's kernel, which the host launches once: a compiled block runs
            # the group's ops inside one graph (their module calls and autograd nodes with
            # them), Transformer Engine's fused layers launch one kernel, and its fused linear
            # layers one call (``trace.fused_expert_fc1``); a compiled block's call is still the host's
            cost = call_s
            t = OpTime(kernels=0, kernel_s=0.0, compute_s=0.0, memory_s=0.0, peak_flops=0.0, count=count,
                       host_s=cost)
        count = next(pending, None)
        if t.host_sync:
            host = max(host, device)
            issued = host
        host += cost + max(0, t.kernels - 1) * profile.kernel_overhead_s
        slices.append(
            HostSlice(event.index, event.name, event.module, event.phase, issued, host, t.kernels > 0)
        )
        if t.kernels:
            t.start_s = max(host, device)
            t.idle_before_s = max(0.0, host - device)
            t.end_s = t.start_s + t.kernel_s
            device = t.end_s
            busy += t.kernel_s
            t.kernel_bound = t.bound
            if t.idle_before_s > 0:
                t.bound = "host"
        else:
            t.start_s = t.end_s = host
        if _syncs(event, trace):
            host = max(host, device) + costs.sync_s
        ops.append(t)
    if optimizer_events:
        # the loop's zero_grad(set_to_none=True) after the optimizer: host work only
        issued = host
        host += costs.zero_grad_s(params)
        slices.append(HostSlice(-1, "zero_grad", "(optimizer)", "optimizer", issued, host, False))
    step = max(host, device)
    if issuing_time(slices) >= busy:  # the host cannot issue work as fast as the device finishes it
        bound = "host"
    else:
        kernel_by_bound: dict[str, float] = {}
        for t in ops:  # a convolution's layout transposes are memory time whatever its bound
            kernel_by_bound[t.kernel_bound] = kernel_by_bound.get(t.kernel_bound, 0.0) + t.kernel_s - t.layout_s
            kernel_by_bound["memory"] = kernel_by_bound.get("memory", 0.0) + t.layout_s
        kernel_by_bound.pop("none", None)
        bound = max(kernel_by_bound, key=kernel_by_bound.get) if kernel_by_bound else "host"
    return StepTime(ops=ops, step_s=step, host_s=host, device_busy_s=busy, bound=bound, host_slices=slices)
