"""How a step is run: training or inference, optimizer, precision, the loop's start state.

One frozen value that the traced step (``trace.capture``) and the measured step
(``measure.step``) both read through ``trace.step``, so a setting means the same thing in a
prediction and in a measurement.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from nnperf.errors import UsageError

OPTIMIZERS = ("adamw", "adam", "sgd", "sgd-momentum", "none")
OPTIMIZER_IMPLS = ("foreach", "single", "fused")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64}
AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
AUTOCAST_DEVICES = ("cuda", "cpu")
SDPA_MODES = ("fused", "cudnn", "unfused")  # trace.attention
POINTWISE_MODES = ("eager", "fused")  # passes.fusion
CHUNKED_LOSSES = ("chunked", "chunked-compiled")  # trace.loss.ChunkedLoss: the model stops before its head
LOSS_MODES = ("eager", "compiled", *CHUNKED_LOSSES)  # trace.loss


@dataclass(frozen=True)
class TraceOptions:
    """How the step is run. Defaults mirror a plain PyTorch training loop on a GPU."""

    train: bool = True
    optimizer: str = "adamw"
    optimizer_impl: str = "foreach"  # PyTorch's default for CUDA tensors
    dtype: str | None = None  # cast the model and floating inputs (pure low precision)
    amp: str | None = None  # autocast dtype (mixed precision)
    real: bool = False  # run on real CPU tensors instead of fake ones
    # Gradients already allocated when the step starts: gradient accumulation from the second
    # micro-batch on, or zero_grad(set_to_none=False). Memory differs (forward runs with grads).
    grads_persist: bool = False
    # torch.amp.GradScaler (scale, unscale_, the found-inf host sync, update). None: the
    # default of a real loop, on for --amp fp16 training (fp16 gradients underflow without
    # it); bf16 has fp32's range and nobody scales it. False: fp16 training without a scaler.
    grad_scaler: bool | None = None
    # torch.channels_last memory format for the model's 4-D weights and inputs (NHWC in
    # memory): PyTorch then keeps CNN activations channels_last, and cuDNN's tensor-core
    # convolutions run without the NCHW<->NHWC transposes they need on NCHW tensors.
    channels_last: bool = False
    # Mixture-of-experts routing a fake trace assumes (trace.routing): each expert's share
    # of the routed (token, slot) pairs; None: uniform.
    moe_load: tuple[float, ...] | None = None
    # Or the load a capacity factor describes: the busiest expert gets this many times the
    # mean, the others share the rest evenly.
    moe_capacity_factor: float | None = None
    # Whose autocast op lists the step follows under --amp: "cuda" (what a GPU runs: the
    # default, trace.autocast_cuda) or "cpu" (a step measured on the CPU).
    autocast_device: str = "cuda"
    # How scaled_dot_product_attention runs (trace.attention): "fused" (one flash-style
    # kernel, what PyTorch picks on a GPU that has one), "cudnn" (one fused kernel with cuDNN's
    # first where it applies: PyTorch's SDPA with cuDNN first in its priority order, and the
    # kernel Transformer Engine's fused attention runs, which Megatron-Core and NeMo prefer on
    # Hopper and later) or "unfused" (GEMM, masked softmax, dropout, GEMM with the score matrix
    # in memory: Megatron-LM's core attention before flash attention, or a GPU/dtype no fused
    # kernel serves).
    sdpa: str = "fused"
    # How the pointwise, reduction and normalization ops inside the repeated blocks run
    # (passes.fusion): "eager" (one kernel each, as written) or "fused" (those between two
    # kernels of another kind as one kernel reading what enters the group and writing what
    # leaves it: torch.compile of each block, as torchtitan compiles the model, and Transformer
    # Engine / Megatron-Core's fused norm, RoPE, SwiGLU and bias-dropout-add kernels).
    pointwise: str = "eager"
    # How the loss function runs (trace.loss): "eager" (as written), "compiled"
    # (torch.compile(loss_fn), as torchtitan's compile.components = ["loss"]: cross entropy as
    # one fused kernel each way, no fp32 copy of the logits kept) or "chunked" (torchtitan's
    # ChunkedLossWrapper: the output projection and loss over 8 chunks of tokens, each chunk's
    # gradient taken at once; built-in decoders; "chunked-compiled" with its inner loss compiled).
    loss: str = "eager"
    # Clip the gradients' global 2-norm to this value between backward and the optimizer step
    # (trace.clip: torchtitan's clip_grad_norm_; Hugging Face's Trainer, torchtitan and
    # Megatron-LM clip to 1.0 by default). None: no clipping.
    clip_grad_norm: float | None = None
    # FP8 training of the linear layers inside the repeated blocks (trace.blocks), as
    # Transformer Engine runs Megatron-LM's transformer layers (--fp8-format hybrid,
    # --fp8-recipe tensorwise: per-tensor current scaling) and torchao's float8 training runs
    # torchtitan's (tensorwise dynamic scaling, the output head left out): their three GEMMs
    # at the FP8 tensor rate, each 16-bit operand scaled and cast first
    # (passes.timing); the head, the embedding and the attention core stay 16-bit.
    fp8: bool = False

    def uses_grad_scaler(self) -> bool:
        """Whether the step runs a GradScaler (``grad_scaler`` resolved)."""
        if self.grad_scaler is not None:
            return self.grad_scaler
        # Pure fp16 weights have fp16 gradients, which GradScaler refuses to unscale.
        return (
            self.train and self.amp == "fp16" and self.dtype != "fp16" and self.optimizer != "none"
        )

    def validate(self) -> None:
        """Reject a value no step can run, with the valid ones (a usage error, exit 2)."""
        if self.optimizer not in OPTIMIZERS:
            raise UsageError(f"unknown optimizer '{self.optimizer}'; valid: {', '.join(OPTIMIZERS)}")
        if self.optimizer_impl not in OPTIMIZER_IMPLS:
            raise UsageError(
                f"unknown optimizer implementation '{self.optimizer_impl}'; "
                f"valid: {', '.join(OPTIMIZER_IMPLS)}"
            )
        if self.dtype is not None and self.dtype not in DTYPES:
            raise UsageError(f"unknown dtype '{self.dtype}'; valid: {', '.join(DTYPES)}")
        if self.amp is not None and self.amp not in AMP_DTYPES:
            raise UsageError(f"unknown autocast dtype '{self.amp}'; valid: {', '.join(AMP_DTYPES)}")
        if self.autocast_device not in AUTOCAST_DEVICES:
            raise UsageError(
                f"unknown autocast device '{self.autocast_device}'; valid: {', '.join(AUTOCAST_DEVICES)}"
            )
        if self.sdpa not in SDPA_MODES:
            raise UsageError(f"unknown SDPA mode '{self.sdpa}'; valid: {', '.join(SDPA_MODES)}")
        if self.pointwise not in POINTWISE_MODES:
            raise UsageError(f"unknown pointwise mode '{self.pointwise}'; valid: {', '.join(POINTWISE_MODES)}")
        if self.loss not in LOSS_MODES:
            raise UsageError(f"unknown loss mode '{self.loss}'; valid: {', '.join(LOSS_MODES)}")
        if self.loss != "eager" and not self.train:
            raise UsageError(f"--loss {self.loss} changes nothing in an inference step (it has no loss); leave it out")
        if self.moe_load is not None and self.moe_capacity_factor is not None:
            raise UsageError("give --moe-load or --moe-capacity-factor, not both")
        if self.moe_load is not None and (
            not self.moe_load or any(not s >= 0 for s in self.moe_load) or not sum(self.moe_load) > 0
        ):
            raise UsageError(
                f"--moe-load {','.join(map(str, self.moe_load))}: shares must be numbers >= 0, "
                "one per expert, not all 0"
            )
        if self.moe_capacity_factor is not None and not self.moe_capacity_factor >= 1:
            raise UsageError(
                f"--moe-capacity-factor {self.moe_capacity_factor}: must be at least 1 "
                "(the busiest expert's load over the mean)"
            )
        if self.clip_grad_norm is not None:
            if not self.clip_grad_norm > 0:
                raise UsageError(f"--clip-grad-norm {self.clip_grad_norm}: the largest gradient norm must be "
                                 "a number > 0, e.g. 1.0")
            if not self.train or self.optimizer == "none":
                raise UsageError("--clip-grad-norm clips gradients before an optimizer step: it needs a training "
                                 "step with an optimizer (leave --optimizer none out, or drop --clip-grad-norm)")
        if self.fp8 and not (self.amp in ("bf16", "fp16") or self.dtype in ("bf16", "fp16")):
            raise UsageError("--fp8 casts the 16-bit inputs of the linear layers to FP8: add --amp bf16 "
                             "(or --dtype bf16)")
        if self.grad_scaler:
            if not self.train or self.optimizer == "none":
                raise UsageError("a gradient scaler needs a training step with an optimizer")
            if self.dtype == "fp16":
                raise UsageError(
                    "a gradient scaler cannot unscale fp16 gradients (--dtype fp16); "
                    "use --amp fp16 with fp32 weights"
                )

    def describe(self) -> str:
        """The step in words, for titles: "training, adamw (foreach), amp bf16"."""
        parts = ["training" if self.train else "inference"]
        if self.train:
            parts.append(f"{self.optimizer} ({self.optimizer_impl})")
        if self.dtype:
            parts.append(self.dtype)
        if self.amp:
            parts.append(f"amp {self.amp}")
        if not self.dtype and not self.amp:  # said: a plan of a model left in fp32 is not a bf16 one
            parts.append("fp32")
        if self.fp8:
            parts.append("FP8 linears")
        if self.channels_last:
            parts.append("channels_last")
        if self.sdpa != "fused":
            parts.append(f"{self.sdpa} attention")
        if self.pointwise != "eager":
            parts.append(f"{self.pointwise} pointwise")
        if self.loss != "eager":
            parts.append(f"{self.loss} loss")
        if self.clip_grad_norm is not None:
            parts.append(f"gradients clipped to norm {self.clip_grad_norm:g}")
        return ", ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
