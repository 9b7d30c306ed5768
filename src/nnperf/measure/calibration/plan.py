"""What ``nnperf calibrate`` measures, scaled to the device and to ``--quick``."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nnperf.measure.calibration.host_parts import PARTS


@dataclass(frozen=True)
class Plan:
    """What to measure; ``plan_for`` scales it to the device and to ``--quick``."""

    gemm_sizes: tuple[int, ...]
    gemm_dtypes: tuple[str, ...]
    skinny_m: int
    conv_shapes: tuple[tuple[int, int, int, int, int, int], ...]  # batch, cin, hw, cout, kernel, stride
    conv_dtype: str
    bandwidth_bytes: tuple[int, ...]
    tiny_ops: int
    transfer_bytes: tuple[int, ...]
    repeats: int
    # What the kernel models still need evidence for (issue 13, and the published-measurement
    # classes of issue 15): rows of few tokens, batched products (attention's bmm),
    # depthwise and grouped convolutions in both memory formats, TF32 for fp32 convolutions,
    # and the host cost of ops of different kinds. Empty: not measured.
    small_m: tuple[int, ...] = ()  # M of (M, N, N) GEMMs at the largest gemm size
    batched_gemm: tuple[tuple[int, int, int, int], ...] = ()  # batch, m, n, k
    conv_variants: tuple[tuple[int, int, int, int, int, int, int], ...] = ()  # + groups
    dispatch_kinds: tuple[str, ...] = ()  # names of DISPATCH_KINDS to time on the host
    # Causal bf16 SDPA of (batch, heads, tokens, q/k head dim, v head dim), forward and
    # backward, on each fused backend that takes it (flash, memory-efficient), and compiled
    # FlexAttention: the profile's attention fractions and the efficient and flex kernels'
    # shares of flash. CUDA only.
    attention_shapes: tuple[tuple[int, int, int, int, int], ...] = ()
    # The parts of an eager step's host work (``host_parts``), on the host beside a GPU.
    host_parts: bool = False

    def counts(self) -> dict[str, int]:
        return {
            "gemm": len(self.gemm_dtypes) * (len(self.gemm_sizes) * 3 + len(self.small_m)),
            "batched gemm": len(self.gemm_dtypes) * len(self.batched_gemm),
            "conv": len(self.conv_shapes) + len(self.conv_variants) * len(CONV_MODES),
            "bandwidth": len(self.bandwidth_bytes) * 2,
            "overhead": 3 + len(self.dispatch_kinds),
            "transfer": len(self.transfer_bytes) * 4,
            "attention": len(self.attention_shapes) * (len(ATTENTION_BACKENDS) + 1),  # + FlexAttention
            "dtensor": 1,
            "host parts": len(PARTS) if self.host_parts else 0,
        }


#: The SDPA backends the attention benchmark times (``torch.nn.attention.SDPBackend`` names).
#: SDPA's fused backends the calibration times, and the name each row records.
ATTENTION_BACKENDS = {"FLASH_ATTENTION": "flash", "EFFICIENT_ATTENTION": "efficient", "CUDNN_ATTENTION": "cudnn"}

#: How each ``conv_variants`` shape runs: (memory format, dtype, TF32 allowed). fp32 with
#: and without TF32 shows what cuDNN's default (TF32 on) buys; bf16 is the AMP case.
CONV_MODES: tuple[tuple[str, str, bool], ...] = (
    ("nchw", "bf16", False), ("channels_last", "bf16", False),
    ("nchw", "fp32", True), ("nchw", "fp32", False), ("channels_last", "fp32", True),
)


def _geometric(lo: int, hi: int, factor: int) -> tuple[int, ...]:
    out, v = [], lo
    while v <= hi:
        out.append(v)
        v *= factor
    return tuple(out)


def plan_for(device: torch.device, quick: bool = False) -> Plan:
    """A measurement plan: small on a CPU and with ``quick`` (under a minute on 2 cores)."""
    if device.type == "cuda":
        return Plan(
            gemm_sizes=(256, 512, 1024, 2048, 4096) if quick else (128, 256, 512, 1024, 2048, 4096, 8192),
            gemm_dtypes=("fp32", "tf32", "fp16", "bf16"),
            skinny_m=64,
            conv_shapes=((32, 64, 56, 64, 3, 1), (32, 256, 56, 64, 1, 1), (32, 128, 28, 128, 3, 1),
                         (32, 512, 7, 512, 3, 1), (32, 3, 224, 64, 7, 2)),
            conv_dtype="bf16",
            bandwidth_bytes=_geometric(2**16, 2**28 if quick else 2**31, 4),
            tiny_ops=1000,
            transfer_bytes=_geometric(2**12, 2**26 if quick else 2**30, 16 if quick else 4),
            repeats=5 if quick else 10,
            small_m=(1, 2, 4, 8, 16, 32),
            batched_gemm=((96, 1024, 1024, 64), (96, 1024, 64, 1024), (32, 512, 512, 128)),
            # MobileNetV2 / EfficientNet depthwise 3x3 and 5x5, ConvNeXt 7x7, ResNeXt grouped 3x3
            conv_variants=((32, 144, 56, 144, 3, 1, 144), (32, 960, 7, 960, 3, 1, 960),
                           (32, 240, 28, 240, 5, 1, 240), (32, 96, 56, 96, 7, 1, 96),
                           (32, 256, 28, 256, 3, 1, 32), (32, 64, 56, 64, 3, 1, 1)),
            dispatch_kinds=tuple(DISPATCH_KINDS),
            # head dim 128 (both backends: the fractions and the efficient kernel's share) and
            # DeepSeek's latent attention, 192 for queries and keys with 128 for values (only
            # the efficient kernel takes it)
            attention_shapes=((2, 8, 1024, 128, 128),) if quick
            else ((8, 16, 4096, 128, 128), (2, 16, 8192, 128, 128), (8, 16, 4096, 192, 128)),
            host_parts=True,
        )
    return Plan(
        gemm_sizes=(64, 128, 256, 512) if quick else (64, 128, 256, 512, 1024, 2048),
        gemm_dtypes=("fp32", "bf16"),
        skinny_m=32,
        conv_shapes=((8, 32, 28, 32, 3, 1), (8, 64, 14, 64, 1, 1)) if quick
        else ((8, 64, 56, 64, 3, 1), (8, 256, 56, 64, 1, 1), (8, 128, 28, 128, 3, 1), (8, 3, 224, 64, 7, 2)),
        conv_dtype="fp32",
        bandwidth_bytes=_geometric(2**16, 2**24 if quick else 2**28, 4),
        tiny_ops=2000,
        transfer_bytes=(),
        repeats=3 if quick else 7,
        small_m=(1, 8),
        batched_gemm=((8, 64, 64, 32),),
        conv_variants=((2, 32, 16, 32, 3, 1, 32), (2, 32, 16, 32, 3, 1, 4)),
        dispatch_kinds=tuple(DISPATCH_KINDS),
    )


#: Ops whose host dispatch cost is timed one by one: eager PyTorch charges more for some
#: kinds (a matmul's shape checks, a norm's several outputs, an in-place optimizer op) than a
#: tiny add, which is all ``host_per_op_s`` measures.
DISPATCH_KINDS = ("add", "mm", "sum", "softmax", "layer_norm", "cat", "index_select", "mul_")
