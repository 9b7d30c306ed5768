"""CUDA's autocast op lists in a trace taken on the CPU.

The trace runs ``torch.autocast("cpu")`` (its tensors are CPU fakes), and CPU autocast casts a
different set of ops from CUDA's: on CUDA ``layer_norm``, ``softmax``, ``log_softmax``,
``sum``, ``exp``, ``pow``, ``rsqrt`` and the losses run in fp32 (a bf16 autocast step keeps
fp32 activations after every LayerNorm), ``addmv``/``einsum``/``mv`` in the low precision,
``addcmul``/``index_put`` promote; CPU instead casts padding, 3-D pooling, FFTs and linear
algebra to fp32 and leaves the norms and softmax in the input's dtype. A trace meant for a GPU
(``TraceOptions.autocast_device == "cuda"``, the default) therefore replaces, for the
duration of the trace, the AutocastCPU kernel of every op either list names by CUDA's policy
for it (``torch.library.Library(...).impl(op, kernel, "AutocastCPU")``, undone at the end):

- ``LOWER_PRECISION``: floating arguments cast to the autocast dtype (fp32 leaf weights that
  require grad cached for the region, as ``cached_cast`` does: while the autocast cache is
  enabled, until the outermost ``torch.autocast`` exits, which calls
  ``torch.clear_autocast_cache``; a checkpointed block's recomputation in backward is such a
  region of its own, so its casts die with the block's backward);
- ``FP32``: floating arguments cast to fp32;
- ``FP32_SET_OPT_DTYPE``: run with ``dtype=torch.float32`` when the first tensor is eligible
  and no dtype is given (softmax computes and returns fp32);
- ``FP32_APPEND_DTYPE``: ``norm`` redispatched to its overload with a dtype;
- ``PROMOTE``: floating arguments cast to the widest of them and the autocast dtype;
- ``BANNED``: ``binary_cross_entropy`` raises, as on CUDA;
- an op only CPU's list names: no cast (a fallthrough kernel).

The lists are ``AT_FORALL_LOWER_PRECISION_FP``, ``AT_FORALL_FP32``,
``AT_FORALL_FP32_SET_OPT_DTYPE``, ``AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE`` and
``AT_FORALL_PROMOTE`` of ``aten/src/ATen/autocast_mode.h`` (torch 2.13's, installed with the
wheel under ``torch/include/ATen``), plus ``cudnn_convolution`` and
``cudnn_convolution_transpose`` (``autocast_mode.cpp``). A test holds them to the ops the
running torch registers for ``AutocastCUDA``. ``_cudnn_rnn``'s own policy (fp16 whatever the
dtype) is ``trace.rnn``'s. "Eligible" is ``is_eligible``: a floating tensor that is not fp64.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch

LOWER_PRECISION = (
    "_convolution.deprecated", "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc",
    "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input", "convolution", "prelu",
    "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear", "addbmm",
    "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot", "_thnn_fused_lstm_cell",
    "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
    "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
    "cudnn_convolution", "cudnn_convolution_transpose",
)
FP32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal",
    "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus",
    "layer_norm", "native_layer_norm", "rms_norm", "group_norm", "frobenius_norm.dim",
    "nuclear_norm", "nuclear_norm.dim", "cosine_similarity", "poisson_nll_loss",
    "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss", "kl_div", "l1_loss",
    "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss", "multilabel_margin_loss",
    "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
    "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d",
    "_upsample_nearest_exact2d", "upsample_nearest3d", "_upsample_nearest_exact3d",
    "upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa", "upsample_trilinear3d",
    "upsample_bicubic2d", "_upsample_bicubic2d_aa",
)
FP32_SET_OPT_DTYPE = (
    "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum",
    "linalg_vector_norm", "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum",
    "sum.dim_IntList",
)
#: norm's overloads without a dtype, redispatched to the one with it.
FP32_APPEND_DTYPE = {"norm.Scalar": "norm.ScalarOpt_dtype",
                     "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype"}
PROMOTE = ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler",
           "index_put", "tensordot", "scatter_add")
BANNED = ("binary_cross_entropy",)
_CUDA_REGISTERED = {name.removeprefix("aten::")
                    for name in torch._C._dispatch_get_registrations_for_dispatch_key("AutocastCUDA")}
#: AutocastCUDA kernels registered outside autocast_mode.h's lists, where the running torch has
#: them (torch 2.14): autocast_mode.cpp's linalg_matrix_sqrth in fp32, and cudnn/AutocastRNN.cpp's
#: _cudnn_rnn, which a trace never calls (trace/rnn.py records nnperf::cudnn_rnn in its place,
#: in fp16 as that kernel casts).
FP32_OUTSIDE_HEADER = tuple(n for n in ("linalg_matrix_sqrth",) if n in _CUDA_REGISTERED)
HANDLED_ELSEWHERE = tuple(n for n in ("_cudnn_rnn",) if n in _CUDA_REGISTERED)
BANNED_MESSAGE = (
    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
    "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
    "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
    "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
    "safe to autocast."
)

_AUTOCAST_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)


def cuda_policy_ops() -> set[str]:
    """Every op (``name`` or ``name.overload``) CUDA's lists give a policy."""
    return {*LOWER_PRECISION, *FP32, *FP32_OUTSIDE_HEADER, *FP32_SET_OPT_DTYPE, *FP32_APPEND_DTYPE,
            *PROMOTE, *BANNED, *HANDLED_ELSEWHERE}


def _op(name: str):
    base, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, base)
    return getattr(packet, overload or "default")


def _eligible(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64


class CudaAutocast:
    """CUDA's autocast policies on the AutocastCPU key while a trace runs (module docstring)."""

    def __init__(self) -> None:
        self._cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def clear_cache(self) -> None:
        """Forget the cached weight casts: the autocast region ended (``torch.autocast``'s exit
        clears C++'s cache the same way)."""
        self._cache.clear()

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        lib = torch.library.Library("aten", "IMPL")
        cuda_ops = cuda_policy_ops()
        # aten's own entries only: other libraries' autocast kernels (torchvision's roi_align,
        # nms) are theirs to keep, and this Library may only implement aten ops
        cpu_only = {name.removeprefix("aten::")
                    for name in torch._C._dispatch_get_registrations_for_dispatch_key("AutocastCPU")
                    if name.startswith("aten::")}
        cpu_only -= cuda_ops
        clear_torch_cache = torch.clear_autocast_cache

        def clear_both() -> None:  # torch.autocast.__exit__ calls it on leaving the outermost region
            clear_torch_cache()
            self._cache.clear()

        torch.clear_autocast_cache = clear_both
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "Overriding a previously registered kernel"
                for name in cuda_ops - set(HANDLED_ELSEWHERE):
                    if _exists(name):
                        lib.impl(name, self._kernel(name), "AutocastCPU")
                for name in cpu_only:
                    lib.impl(name, torch.library.fallthrough_kernel, "AutocastCPU")
            yield
        finally:
            torch.clear_autocast_cache = clear_torch_cache
            lib._destroy()
            self._cache.clear()

    # -- kernels --------------------------------------------------------------------------
    def _kernel(self, name: str):
        op = _op(name)
        if name in LOWER_PRECISION:
            return lambda *a, **k: self._call(op, a, k, lambda: torch.get_autocast_dtype("cpu"))
        if name in FP32 or name in FP32_OUTSIDE_HEADER:
            return lambda *a, **k: self._call(op, a, k, lambda: torch.float32)
        if name in PROMOTE:
            return lambda *a, **k: self._call(op, a, k, None)
        if name in FP32_SET_OPT_DTYPE:
            return lambda *a, **k: self._set_opt_dtype(op, a, k)
        if name in FP32_APPEND_DTYPE:
            with_dtype = _op(FP32_APPEND_DTYPE[name])
            return lambda *a, **k: self._append_dtype(with_dtype, a, k)
        return _banned

    def _call(self, op, args: tuple, kwargs: dict, to_type) -> Any:
        low = torch.get_autocast_dtype("cpu")
        if to_type is None:  # promote: the widest of the autocast dtype and the eligible inputs
            target = low
            for t in _flat(args, kwargs):
                if _eligible(t) and t.dtype != target:
                    # two different dtypes of fp16, bf16 and fp32 promote to fp32 (written out:
                    # ``torch.promote_types`` is an op the trace would record)
                    target = torch.float32
        else:
            target = to_type()
        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_CPU):
            args = tuple(self._cast(a, target, low) for a in args)
            kwargs = {k: self._cast(v, target, low) for k, v in kwargs.items()}
            return op(*args, **kwargs)

    def _cast(self, value: Any, target: torch.dtype, low: torch.dtype) -> Any:
        if isinstance(value, (list, tuple)):
            return type(value)(self._cast(v, target, low) for v in value)
        if not _eligible(value) or value.dtype == target:
            return value
        cacheable = (target == low and value.dtype == torch.float32 and value.requires_grad
                     and value.is_leaf and not value._is_view() and torch.is_autocast_cache_enabled())
        if not cacheable:
            return value.to(target)
        hit = self._cache.get(id(value))
        if hit is not None and hit[0] is value:
            return hit[1]
        cast = value.to(target)
        self._cache[id(value)] = (value, cast)
        return cast

    def _set_opt_dtype(self, op, args: tuple, kwargs: dict) -> Any:
        first = next((t for t in _flat(args, kwargs) if isinstance(t, torch.Tensor)), None)
        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_CPU):
            if not _eligible(first):
                return op(*args, **kwargs)
            names = [a.name for a in op._schema.arguments]
            at = names.index("dtype")
            if at < len(args):
                if args[at] is None:
                    args = (*args[:at], torch.float32, *args[at + 1:])
            elif kwargs.get("dtype") is None:
                kwargs = {**kwargs, "dtype": torch.float32}
            return op(*args, **kwargs)

    def _append_dtype(self, with_dtype, args: tuple, kwargs: dict) -> Any:
        first = args[0]
        dtype = torch.float32 if _eligible(first) else first.dtype
        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_CPU):
            return with_dtype(*args, dtype=dtype, **kwargs)


def _banned(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError(BANNED_MESSAGE)


def _flat(args: tuple, kwargs: dict) -> list:
    out: list = []
    for v in (*args, *kwargs.values()):
        out.extend(v if isinstance(v, (list, tuple)) else [v])
    return out


def _exists(name: str) -> bool:
    try:
        _op(name)
    except (AttributeError, RuntimeError):
        return False
    return True
