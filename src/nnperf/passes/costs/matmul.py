"""Matrix products and convolutions, each expressed as the GEMM(s) a GPU library runs.

Shapes follow the row-major output convention: M = output rows (tokens, or N*P*Q pixels for
an implicit-GEMM convolution), N = output columns (features / output channels), K = the
reduction. FLOPs = 2 * M * N * K * batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nnperf.passes.costs.registry import CONV, GEMM, OpCost, numel, register, tensors
from nnperf.trace.events import OpEvent, TensorMeta


@dataclass(frozen=True, slots=True)
class GemmShape:
    m: int
    n: int
    k: int
    batch: int = 1
    role: str | None = None  # set where the op itself knows (convolution backward)

    @property
    def macs(self) -> int:
        return self.m * self.n * self.k * self.batch

    @property
    def flops(self) -> int:
        return 2 * self.macs


def gemm_shapes(event: OpEvent) -> list[GemmShape]:
    """The GEMMs an op performs; empty for ops that are not matrix products."""
    fn = _SHAPES.get(event.name)
    return fn(event) if fn is not None else []


def register_shapes(name: str, fn: Callable[[OpEvent], list[GemmShape]]) -> None:
    """Lower the op ``name`` to GEMMs with ``fn``: for ops made of several GEMMs whose formula
    module owns their structure (cuDNN RNNs, grouped GEMMs)."""
    if name in _SHAPES:
        raise ValueError(f"GEMM shapes for {name} are already registered")
    _SHAPES[name] = fn


def _mm(event: OpEvent) -> list[GemmShape]:
    a, b = _last_two(event)
    return [GemmShape(a.shape[0], b.shape[1], a.shape[1])]


def _bmm(event: OpEvent) -> list[GemmShape]:
    a, b = _last_two(event)
    return [GemmShape(a.shape[1], b.shape[2], a.shape[2], a.shape[0])]


def _mv(event: OpEvent) -> list[GemmShape]:
    a, _ = _last_two(event)
    return [GemmShape(a.shape[0], 1, a.shape[1])]


def _dot(event: OpEvent) -> list[GemmShape]:
    a = tensors(event.args)[0]
    return [GemmShape(1, 1, a.shape[0])]


def _addbmm(event: OpEvent) -> list[GemmShape]:
    a, b = _last_two(event)
    return [GemmShape(a.shape[1], b.shape[2], a.shape[2], a.shape[0])]


def _last_two(event: OpEvent) -> tuple[TensorMeta, TensorMeta]:
    """The two matrix operands: for addmm-style ops the first tensor is the added term."""
    ts = tensors(event.args)
    return ts[-2], ts[-1]


# -- convolution ----------------------------------------------------------------------------
def _conv_params(event: OpEvent):
    a = event.args
    x, w = a[0], a[1]
    transposed = bool(a[6]) if len(a) > 6 else False
    groups = int(a[8]) if len(a) > 8 else 1
    return x, w, transposed, groups


def _conv_forward_shape(x: TensorMeta, w: TensorMeta, out_spatial, transposed: bool, groups: int):
    """Implicit GEMM of a convolution: M = N*P*Q, N = Cout/g, K = Cin/g*R*S, batch = groups.

    A transposed convolution is the data-gradient of an ordinary one: it runs as the GEMM
    M = N*H*W (its input pixels), N = Cout/g*R*S, K = Cin/g, then scatters (col2im).
    """
    n = x.shape[0]
    kernel = numel(w.shape[2:])
    if not transposed:
        cout, cin_g = w.shape[0], w.shape[1]
        return GemmShape(n * numel(out_spatial), cout // groups, cin_g * kernel, groups)
    cin, cout_g = w.shape[0], w.shape[1]
    return GemmShape(n * numel(x.shape[2:]), cout_g * kernel, cin // groups, groups)


def _convolution(event: OpEvent) -> list[GemmShape]:
    x, w, transposed, groups = _conv_params(event)
    out = event.outputs[0]
    return [_conv_forward_shape(x, w, out.shape[2:], transposed, groups)]


def _convolution_backward(event: OpEvent) -> list[GemmShape]:
    """grad_input and grad_weight of a convolution, each with the forward's MAC count.

    With the forward as (M=NPQ, N=Cout/g, K=Cin/g*RS): data gradient = (NPQ, Cin/g*RS, Cout/g)
    followed by col2im; weight gradient = (Cout/g, Cin/g*RS, NPQ). Transposed convolutions
    swap the two spatial sides, which the forward shape already accounts for.
    """
    a = event.args
    grad_out, x, w = a[0], a[1], a[2]
    # (grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
    #  output_padding, groups, output_mask)
    transposed, groups, mask = bool(a[7]), int(a[9]), a[10]
    fwd = _conv_forward_shape(x, w, grad_out.shape[2:], transposed, groups)
    shapes = []
    if mask[0]:
        shapes.append(GemmShape(fwd.m, fwd.k, fwd.n, groups, role="grad_input"))
    if mask[1]:
        shapes.append(GemmShape(fwd.n, fwd.k, fwd.m, groups, role="grad_weight"))
    return shapes


def is_depthwise(event: OpEvent) -> bool:
    """A depthwise convolution (every group sees one input channel: MobileNet, EfficientNet,
    ConvNeXt). PyTorch does not run it as an implicit GEMM: ``_select_conv_backend``
    (aten/src/ATen/native/Convolution.cpp) picks ``CudaDepthwise2d/3d``, the direct kernels of
    ``aten/src/ATen/native/cuda/DepthwiseConv2d.cu`` (``conv_depthwise2d_forward_kernel``,
    ``..._backward_kernel``, ``..._grad_weight_kernel``: CUDA-core FMAs accumulated in fp32),
    or cuDNN's grouped direct kernels for the fp16/bf16 shapes ``use_cudnn_depthwise`` accepts;
    neither uses tensor-core tiles, which would need >= 8 channels per group."""
    if event.name not in _CONVOLUTIONS:
        return False
    backward = event.name == "aten.convolution_backward"
    x, w = (event.args[1], event.args[2]) if backward else (event.args[0], event.args[1])
    transposed = bool(event.args[7]) if backward else _conv_params(event)[2]
    groups = int(event.args[9]) if backward else _conv_params(event)[3]
    if transposed or groups <= 1 or not isinstance(w, TensorMeta) or not isinstance(x, TensorMeta):
        return False
    return w.shape[1] == 1 and groups == x.shape[1]


_CONVOLUTIONS = ("aten.convolution", "aten._convolution", "aten.convolution_backward")


def conv_geometry(event: OpEvent) -> tuple[int, int]:
    """A convolution's largest stride and its output positions per image (P*Q in 2-D; a
    backward event: its output gradient's), what ``DeviceProfile.conv_efficiency_of`` asks."""
    if event.name == "aten.convolution_backward":
        out, stride = event.args[0], event.args[4]
    else:
        out, stride = event.outputs[0], (event.args[3] if len(event.args) > 3 else [1])
    return max((int(s) for s in stride), default=1), numel(out.shape[2:])


def input_channel_bytes(event: OpEvent) -> int | None:
    """Bytes of one pixel's input channels per group of a forward convolution on NCHW tensors
    (3 x 2 for a bf16 RGB stem), what ``DeviceProfile.conv_efficiency_of`` asks; None for a
    backward event, a transposed convolution or a channels-last input (the low-channel class
    was measured on NCHW tensors only)."""
    if event.name == "aten.convolution_backward":
        return None
    x, _w, transposed, groups = _conv_params(event)
    if transposed or not _nchw(x):
        return None
    return x.shape[1] // max(1, groups) * x.itemsize


def channels_last(t: TensorMeta) -> bool:
    """A 4-D tensor laid out NHWC in memory (``torch.channels_last``): its channel stride is 1."""
    return len(t.shape) == 4 and t.shape[1] > 1 and t.stride[1] == 1


def nchw_transposes(event: OpEvent, pointwise_native: bool = False) -> list[int]:
    """Bytes of each tensor cuDNN transposes around a tensor-core convolution of NCHW tensors.

    Tensor-core convolutions run natively in NHWC: "Choose tensor layouts in memory to avoid
    transposing input and output data ... We recommend using the NHWC format" (NVIDIA, Deep
    Learning Performance, Convolutional Layers User's Guide, quick-start checklist and "Tensor
    Layouts In Memory: NCHW vs NHWC"); "the NCHW tensor must be transposed to NHWC before the
    convolution" (NVIDIA's diagram in MosaicML Composer's "Channels Last" method card); cuDNN
    "can internally transpose your NCHW data to NHWC if a faster kernel can be found" (ptrblck,
    discuss.pytorch.org/t/123686). Which tensors, from the
    kernel names in public Nsight Systems listings of PyTorch NCHW TF32/fp16 convolutions on
    A100 (cuDNN 8/9): ``nchwToNhwcKernel`` runs on the input and the filter, the forward kernel
    ``sm80_xmma_fprop_implicit_gemm_..._nhwckrsc_nchw_...`` writes its output in NCHW itself;
    data-gradient kernels ``..._dgrad_..._nhwckrsc_nhwc_...`` write NHWC, which
    ``nhwcToNchwKernel`` turns back. So: forward, input and filter; backward, the output
    gradient, then the filter and the input gradient back (data gradient) and the input and
    the filter gradient back (weight gradient). Empty when the input is channels_last (PyTorch
    hands cuDNN NHWC tensors) or not 4-D, and, with ``pointwise_native`` (where cuDNN's layout
    handling was measured: ``passes.timing``), for the forward pass of a pointwise convolution
    (1x1, stride 1, no padding, one group), a GEMM over each image's (C, H*W) matrix in NCHW as
    it is: on the H200 (validation/data/h200-sxm/profile.json, conv rows) a bf16 NCHW 1x1
    convolution 256 -> 64 at 56x56, batch 32, took 21.8 us, 2.9 TB/s over its own tensors,
    where the transposes alone would take longer than that at the rate the 3x3 pairs measure
    (``layout_transpose_bytes_per_clock_sm``). Its gradients keep their transposes: no
    backward pass was measured."""
    if event.name == "aten.convolution_backward":
        grad_out, x, w = event.args[0], event.args[1], event.args[2]
        if not _nchw(x):
            return []
        mask = event.args[10]
        out = [grad_out.nbytes]
        if mask[0]:
            out += [w.nbytes, x.nbytes]  # filter in, input gradient back
        if mask[1]:
            out += [x.nbytes, w.nbytes]  # input in, filter gradient back
        return out
    x, w = event.args[0], event.args[1]
    stride = event.args[3] if len(event.args) > 3 else [1]
    padding = event.args[4] if len(event.args) > 4 else [0]
    if not _nchw(x) or (pointwise_native and _pointwise(w, stride, padding, _conv_params(event)[3])):
        return []
    return [x.nbytes, w.nbytes]


def _pointwise(w: object, stride: object, padding: object, groups: int) -> bool:
    """A 1x1 convolution with stride 1, no padding and one group."""
    ones = isinstance(w, TensorMeta) and all(k == 1 for k in w.shape[2:])
    return (ones and groups == 1 and all(int(s) == 1 for s in (stride or [1]))
            and all(int(p) == 0 for p in (padding or [0])))


#: Winograd F(2x2, 3x3): a 2x2 output tile from a 4x4 input tile costs 16 multiplies instead
#: of 2*2*9 = 36 (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks", CVPR 2016).
WINOGRAD_TILE = 2
WINOGRAD_MULTIPLIES_PER_TILE = 16


def winograd_fraction(event: OpEvent) -> float | None:
    """Multiplies of cuDNN's fused Winograd kernel over those of the direct (implicit-GEMM)
    convolution, for a 3x3, stride-1, undilated, ungrouped 2-D convolution; None where it does
    not apply. fp32 convolutions on CUDA cores run it: ``*_scudnn_winograd_128x128_ldg1_ldg4_*``
    kernels in public PyTorch and TensorFlow profiles (Maxwell to Ampere), for the forward and
    the data gradient (a stride-1 3x3 convolution too), not the weight gradient. Output tiles of
    2x2 waste work on odd sizes: the fraction is 16 * ceil(P/2) * ceil(Q/2) / (9 * P * Q)."""
    if event.name == "aten.convolution_backward":
        a = event.args
        w, out, stride, dilation, transposed, groups = a[2], a[0], a[4], a[6], a[7], a[9]
    elif event.name in _CONVOLUTIONS:
        a = event.args
        w, out = a[1], event.outputs[0]
        stride, dilation = (a[3] if len(a) > 3 else [1]), (a[5] if len(a) > 5 else [1])
        transposed, groups = _conv_params(event)[2], _conv_params(event)[3]
    else:
        return None
    if not isinstance(w, TensorMeta) or len(w.shape) != 4 or tuple(w.shape[2:]) != (3, 3):
        return None
    if transposed or int(groups) != 1 or any(int(s) != 1 for s in stride) or any(int(d) != 1 for d in dilation):
        return None
    p, q = out.shape[2], out.shape[3]
    tiles = -(-p // WINOGRAD_TILE) * -(-q // WINOGRAD_TILE)
    return WINOGRAD_MULTIPLIES_PER_TILE * tiles / (9 * p * q)


def _nchw(t: object) -> bool:
    return isinstance(t, TensorMeta) and len(t.shape) == 4 and t.shape[1] > 1 and not channels_last(t)

_SHAPES = {
    "aten.mm": _mm,
    "aten.addmm": _mm,
    "aten._addmm_activation": _mm,
    "aten.bmm": _bmm,
    "aten.baddbmm": _bmm,
    "aten.addbmm": _addbmm,
    "aten.mv": _mv,
    "aten.addmv": _mv,
    "aten.dot": _dot,
    "aten.vdot": _dot,
    "aten.convolution": _convolution,
    "aten._convolution": _convolution,
    "aten.convolution_backward": _convolution_backward,
}


_PRODUCTS = [name for name in _SHAPES if "convolution" not in name]


@register(*_PRODUCTS)
def _product_cost(event: OpEvent) -> OpCost:
    """FLOPs are 2 per MAC; an addmm-style epilogue (bias, beta*C) is fused and not counted,
    as in ``torch.utils.flop_counter``."""
    macs = sum(g.macs for g in gemm_shapes(event))
    return OpCost(GEMM, flops=2 * macs, macs=macs, reads=tensors(event.args), writes=event.outputs)


@register("aten.convolution", "aten._convolution", "aten.convolution_backward")
def _convolution_cost(event: OpEvent) -> OpCost:
    """Implicit-GEMM MACs; the bias add (forward) and bias gradient are not counted as FLOPs."""
    macs = sum(g.macs for g in gemm_shapes(event))
    return OpCost(
        CONV, flops=2 * macs, macs=macs, reads=tensors(event.args[:3]), writes=event.outputs
    )
