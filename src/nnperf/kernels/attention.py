"""Which kernel ``F.scaled_dot_product_attention`` runs on a CUDA GPU, and the math fallback's time.

PyTorch picks the backend at run time (``select_sdp_backend``,
``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``, torch 2.13): it walks a priority
order and takes the first backend whose checks all pass. The default order is flash,
memory-efficient, math, cuDNN (``Context``'s ``sDPPriorityOrder``), so cuDNN is reached only
with math disabled, unless ``check_prefer_cudnn_attention`` holds (cuDNN runtime > 9.15 on
compute capability 9.x/10.x), which puts cuDNN first. Each rule below names its check. The
trace records every SDPA call as ``nnperf::attention`` (``trace.attention``), with what these
checks read: dtype, head dimensions, sequence lengths, heads, mask, dropout, causal, GQA and
the strides of q, k and v.

Only dense (not nested) inputs are modelled; a deterministic-algorithms setting and the
data-pointer alignment check are assumed satisfied.

Megatron-LM's layouts do not call SDPA: Transformer Engine's ``DotProductAttention`` picks its
own kernel, and with cuDNN asked for (``--sdpa cudnn``, Megatron-LM's ``--attention-backend
fused``) its own filter decides whether cuDNN's kernel serves the call
(``can_use_te_cudnn``), not PyTorch's: Transformer Engine passes q, k and v to cuDNN in its own
layout and allows the wider heads of latent attention (192/128) and Nemotron-4 (192) on Hopper,
and any dropout probability (PyTorch's cuDNN path takes multiples of 1/16 only). On Hopper it
prefers cuDNN wherever both serve a call ("Disabling FlashAttention to give FusedAttention
preference on Hopper+ for performance reasons", its dot_product_attention/utils.py). The time of
a fused kernel's dropout (its random numbers) is not modelled, here or for flash.
"""

from __future__ import annotations

from dataclasses import dataclass

from nnperf.hardware import GPU
from nnperf.kernels.engines import PYTORCH, TRANSFORMER_ENGINE

FLASH = "flash"
EFFICIENT = "efficient"
CUDNN = "cudnn"
MATH = "math"
#: FlexAttention's kernel (inductor's Triton template), not an SDPA backend: its ops.
FLEX = "flex"
FLEX_OPS = frozenset({"higher_order.flex_attention", "higher_order.flex_attention_backward"})

#: The cuDNN runtime Transformer Engine runs on in the NVIDIA containers Megatron-LM and NeMo
#: runs name: 9.7 (NGC PyTorch 25.01's cuDNN 9.7.0, the base of the 2025 NeMo containers, and
#: newer after it). The rules below ask at most 9.5 of Hopper and 9.7/9.11 of Blackwell.
TE_CUDNN_RUNTIME = 90700

#: ``sDPPriorityOrder``'s default (``aten/src/ATen/Context.h``).
DEFAULT_ORDER = (FLASH, EFFICIENT, MATH, CUDNN)
#: ``priority_order`` when ``check_prefer_cudnn_attention`` holds.
CUDNN_FIRST = (CUDNN, FLASH, EFFICIENT, MATH)


@dataclass(frozen=True)
class SdpaCall:
    """What the backend checks read of one SDPA call (q: [B, Hq, Lq, E], k: [B, Hkv, Lk, E],
    v: [B, Hkv, Lk, Ev]); strides of q, k, v for cuDNN's layout check."""

    dtype: str
    batch: int
    heads_q: int
    heads_kv: int
    q_len: int
    kv_len: int
    head_dim: int
    head_dim_k: int
    head_dim_v: int
    has_mask: bool = False
    dropout: float = 0.0
    causal: bool = False
    enable_gqa: bool = False
    requires_grad: bool = False
    strides: tuple[tuple[int, ...], ...] = ()


def capability(gpu: GPU) -> tuple[int, int]:
    """The GPU's compute capability (0, 0 for a non-NVIDIA GPU: none of these kernels)."""
    parts = (gpu.compute_capability or "").split(".")
    if gpu.vendor != "NVIDIA" or len(parts) != 2 or not all(p.isdigit() for p in parts):
        return 0, 0
    return int(parts[0]), int(parts[1])


def can_use_te_cudnn(call: SdpaCall, gpu: GPU, cudnn_runtime: int = TE_CUDNN_RUNTIME) -> bool:
    """Transformer Engine's FusedAttention with cuDNN's fp16/bf16 arbitrary-sequence-length
    kernel for ``call``: its own filter (``nvte_get_fused_attn_backend``,
    transformer_engine/common/fused_attn/fused_attn.cpp at d0067d0d): sm 8.x-9.x (10.x with
    cuDNN 9.7); head dims multiples of 8, at most 128, or at most 256 on Hopper (cuDNN 9.1
    forward, 9.5 with backward), or 192/128 training on Blackwell (cuDNN 9.11); not, from cuDNN
    9.11, Hopper's backward of unequal heads both 128 or wider other than 192/128 (a cuDNN bug
    it works around). Its layout check (separate q, k, v: "hd_hd_hd") holds for the zoo's
    attention and Megatron-Core's."""
    major, minor = capability(gpu)
    sm = major * 10 + minor
    if call.dtype not in ("fp16", "bf16"):
        return False
    if not (80 <= sm < 100 or (sm >= 100 and cudnn_runtime >= 90700)):
        return False
    dq, dv, training = call.head_dim, call.head_dim_v, call.requires_grad
    if dq % 8 or dv % 8:
        return False
    served = ((dq <= 128 and dv <= 128)
              or (dq <= 256 and dv <= 256 and sm == 90 and cudnn_runtime >= (90500 if training else 90100))
              or (not training and sm >= 100 and cudnn_runtime >= 90900 and call.q_len > 1)
              or ((dq, dv) == (192, 128) and training and sm >= 100 and cudnn_runtime >= 91100))
    hopper_wide_heads_bug = (cudnn_runtime >= 91100 and training and sm == 90 and dq >= 128 and dv >= 128
                             and (dq, dv) != (192, 128) and dq != dv)
    return served and not hopper_wide_heads_bug


def select_backend(call: SdpaCall, gpu: GPU, cudnn_runtime: int = 0, cudnn_first: bool = False,
                   engine: str = PYTORCH) -> str:
    """The backend ``select_sdp_backend`` takes for ``call`` on ``gpu`` (``cudnn_runtime``: the
    cuDNN runtime version as ``versionRuntimeCuDNN`` reports it, e.g. 91600; 0 unknown);
    ``cudnn_first``: cuDNN put first in the priority order (``--sdpa cudnn``:
    ``sdpa_kernel([CUDNN_ATTENTION, ...], set_priority=True)``). ``engine``: whose checks give
    cuDNN the call when it is asked for (``TRANSFORMER_ENGINE``: ``can_use_te_cudnn``); a call
    they refuse falls back as PyTorch's order does."""
    if cudnn_first and engine == TRANSFORMER_ENGINE and can_use_te_cudnn(call, gpu):
        return CUDNN
    order = CUDNN_FIRST if cudnn_first or prefers_cudnn(gpu, cudnn_runtime) else DEFAULT_ORDER
    checks = {FLASH: can_use_flash, EFFICIENT: can_use_efficient,
              CUDNN: lambda c, g: can_use_cudnn(c, g, cudnn_runtime), MATH: lambda c, g: True}
    for backend in order:
        if checks[backend](call, gpu):
            return backend
    return MATH


def prefers_cudnn(gpu: GPU, cudnn_runtime: int) -> bool:
    """``check_prefer_cudnn_attention``: cuDNN runtime > 9.15.0 on sm 9.x or 10.x (CUDA 13
    builds; CUDA 12 builds also require minor 0 or 3)."""
    major, _ = capability(gpu)
    return cudnn_runtime > 91500 and major in (9, 10)


def _common_dense(call: SdpaCall) -> bool:
    """``check_nonzero_sequence_lengths_dense`` and ``check_batch_size_and_num_heads_dense``
    (grouped-query heads only with ``enable_gqa``, query heads a multiple of KV heads)."""
    if min(call.q_len, call.kv_len, call.batch) <= 0:
        return False
    if call.heads_q == call.heads_kv:
        return True
    return call.enable_gqa and call.heads_kv > 0 and call.heads_q % call.heads_kv == 0


def can_use_flash(call: SdpaCall, gpu: GPU) -> bool:
    """``can_use_flash_attention``."""
    major, minor = capability(gpu)
    if call.has_mask:  # check_for_attn_mask: no arbitrary mask
        return False
    # check_head_dim_size_flash: q, k, v share the last dimension, at most 256
    if not (call.head_dim == call.head_dim_k == call.head_dim_v <= 256):
        return False
    if not (8, 0) <= (major, minor) <= (12, 1):  # check_flash_attention_hardware_support
        return False
    # check_requires_grad_and_head_dim_gt192_constraints_on_sm86_89_or_120
    if call.requires_grad and ((8, 6) <= (major, minor) <= (8, 9) or (12, 0) <= (major, minor) <= (12, 1)):
        d = call.head_dim
        if not (d <= 192 or (call.dropout == 0.0 and d > 224)):
            return False
    if call.causal and call.q_len != call.kv_len:  # check_flash_causal_non_square_seqlens
        return False
    if call.dtype not in ("fp16", "bf16"):  # check_dtypes_flash_attention (sm80+)
        return False
    return _common_dense(call)


def gemm_alignment(call: SdpaCall, gpu: GPU) -> int:
    """``minimum_gemm_alignment``: 4 from sm80, and 128 bits where tensor cores run (sm80+
    always, sm70+ for fp16/bf16): 8 elements of fp16/bf16, 4 of fp32."""
    major, _ = capability(gpu)
    half = call.dtype in ("fp16", "bf16")
    tensor_cores = major >= 8 or (major >= 7 and half)
    alignment = 4 if major >= 8 else 1
    if tensor_cores:
        alignment = max(alignment, 128 // (16 if half else 32))
    return alignment


def efficient_uses_tensor_cores(dtype: str, gpu: GPU) -> bool:
    """``use_tensor_cores``: sm80+ always (fp32 as 3xTF32, ``OpMultiplyAddFastF32`` in the
    kernel's ``DefaultGemmType``), sm70+ for fp16/bf16."""
    major, _ = capability(gpu)
    return major >= 8 or (major >= 7 and dtype in ("fp16", "bf16"))


def can_use_efficient(call: SdpaCall, gpu: GPU) -> bool:
    """``can_use_mem_efficient_attention`` (masks and dropout allowed)."""
    major, minor = capability(gpu)
    if not (5, 0) <= (major, minor) <= (12, 1):  # check_mem_efficient_hardware_support
        return False
    # check_head_dim_size_mem_efficient: q and k share the last dimension; q's and v's are
    # multiples of the GEMM alignment
    align = gemm_alignment(call, gpu)
    if call.head_dim != call.head_dim_k or call.head_dim % align or call.head_dim_v % align:
        return False
    if not _common_dense(call):
        return False
    allowed = ("fp16", "fp32", "bf16") if major >= 8 else ("fp16", "fp32")
    return call.dtype in allowed


def can_use_cudnn(call: SdpaCall, gpu: GPU, cudnn_runtime: int) -> bool:
    """``can_use_cudnn_attention`` with a cuDNN 9 runtime (``cudnn_runtime``; 0: assumed 9.0)."""
    major, minor = capability(gpu)
    version = cudnn_runtime or 90000
    if call.dropout > 0 and 91100 < version < 91400:
        return False
    if call.dropout * 16 != int(call.dropout * 16):  # check_cudnn_dropout: multiples of 1/16
        return False
    if call.dtype not in ("fp16", "bf16") or not (8, 0) <= (major, minor) <= (12, 1):
        return False
    # check_cudnn_tensor_shapes: head dims at most 128 (256 on sm 9.0/10.x with cuDNN > 9.22),
    # multiples of 8; a key length of 1 and a query length of 1 with dropout refused
    sm90_or_10x = (major == 9 and minor == 0) or major == 10
    limit = 256 if sm90_or_10x and version > 92200 else 128
    if call.head_dim > limit or call.head_dim_v > limit or call.head_dim % 8 or call.head_dim_v % 8:
        return False
    if call.kv_len == 1 or (call.dropout > 0 and call.q_len == 1):
        return False
    if call.batch > 65535 or call.heads_q > 65535:
        return False
    return _cudnn_layout(call) and _cudnn_backward_dims(call, sm90_or_10x and version > 92200)


def _cudnn_layout(call: SdpaCall) -> bool:
    """``check_cudnn_layout``: q, k, v as [B, H, S, D] views of [B, S, H, D] (what a linear
    projection followed by ``view`` and ``transpose(1, 2)`` gives), or of a packed QKV tensor."""
    if len(call.strides) != 3:
        return False
    q, k, v = call.strides
    dims = ((call.heads_q, call.q_len, call.head_dim), (call.heads_kv, call.kv_len, call.head_dim_k),
            (call.heads_kv, call.kv_len, call.head_dim_v))

    def ok(stride, hsd, factor):
        h, s, d = hsd
        return stride == (s * factor * h * d, d, factor * h * d, 1)

    plain = all(ok(st, hsd, 1) for st, hsd in zip((q, k, v), dims, strict=True))
    packed = ok(v, dims[2], 3)
    return plain or packed


def _cudnn_backward_dims(call: SdpaCall, supports_d256: bool) -> bool:
    """``check_cudnn_d256_bprop_head_dim``: training with d256 support allows d <= 128,
    (192, 128) or (256, 256)."""
    if not call.requires_grad or not supports_d256:
        return True
    dq, dv = call.head_dim, call.head_dim_v
    return (dq <= 128 and dv <= 128) or (dq, dv) in ((192, 128), (256, 256))


# -- the math backend -------------------------------------------------------------------------
@dataclass(frozen=True)
class MathAttention:
    """The math backend's work (``_scaled_dot_product_attention_math``,
    ``aten/src/ATen/native/transformers/attention.cpp``): two batched GEMMs forward over every
    (query, key) pair, the causal or explicit mask applied after; the score matrix written and
    read by each elementwise kernel (scale, mask, softmax, dropout); backward four GEMMs and
    the softmax (and dropout) backward over the same matrix."""

    gemms: tuple[tuple[int, int, int, int], ...]  # (M, N, K, batch)
    score_passes: int  # kernels reading and writing the score matrix once each
    score_elements: int


def math_attention(call: SdpaCall, backward: bool) -> MathAttention:
    bh = call.batch * call.heads_q
    lq, lk, e, ev = call.q_len, call.kv_len, call.head_dim, call.head_dim_v
    masked = call.has_mask or call.causal
    dropout = call.dropout > 0
    if not backward:
        gemms = ((lq, lk, e, bh), (lq, ev, lk, bh))  # Q @ K^T, P @ V
        passes = 1 + int(masked) + 1 + int(dropout)  # scale, mask, softmax, dropout
    else:
        gemms = ((lq, lk, ev, bh), (lk, ev, lq, bh), (lq, e, lk, bh), (lk, e, lq, bh))  # dP, dV, dQ, dK
        passes = 1 + int(dropout) + 1  # softmax backward, dropout backward, scale backward
    return MathAttention(gemms, passes, bh * lq * lk)
