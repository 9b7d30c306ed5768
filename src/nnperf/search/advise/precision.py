"""Precision: AMP bf16/fp16, pure bf16, TF32 for fp32 matmuls, FP8 linears.

AMP and pure bf16 change which ops run and what is saved, so they are traced again; TF32
only changes the rate fp32 matmuls run at (``TimingOptions``); FP8 re-times the linear
GEMMs that gain at the FP8 tensor rate, each paying the casts of its two operands.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from nnperf.kernels.gemm import estimate_gemm
from nnperf.passes.costs import registry as cat
from nnperf.search.advise.change import Candidate, Change
from nnperf.search.advise.rewrite import Rewritten, count_events, rebuild, synthetic, with_dtype

if TYPE_CHECKING:
    from nnperf.hardware import GPU, DeviceProfile
    from nnperf.search.advise.evaluate import Base

_FP8 = getattr(torch, "float8_e4m3fn", None)
_WEIGHT_ROLES = ("forward", "grad_input", "grad_weight")


def candidates(base: Base) -> list[Candidate]:
    step = base.options.trace
    gpu = base.gpu
    dtypes = gpu.supported_dtypes()
    out = []
    fp32 = step.amp is None and step.dtype in (None, "fp32")
    if fp32 or step.amp == "fp16":
        for amp in ("bf16", "fp16"):
            if amp in dtypes and amp != step.amp:
                out.append(Candidate(
                    name=f"amp-{amp}", family="precision", title=f"mixed precision: autocast to {amp}",
                    change=Change(trace=(("amp", amp),)),
                    how=f"with torch.autocast('cuda', dtype=torch.{_torch(amp)}): loss = model(x)"
                        + ("  # plus torch.amp.GradScaler" if amp == "fp16" else "")
                        + f"   (nnperf: --amp {amp})",
                    layers=["every layer"],
                    assumptions=["accuracy unchanged (not predicted)"]
                                + (["fp16 training runs a GradScaler (its found-inf sync is traced)"]
                                   if amp == "fp16" else []),
                ))
    if step.dtype != "bf16" and "bf16" in dtypes:
        out.append(Candidate(
            name="pure-bf16", family="precision", title="pure bf16: weights, gradients and optimizer states in bf16",
            change=Change(trace=(("amp", None), ("dtype", "bf16"))),
            how="model.to(torch.bfloat16)   (nnperf: --dtype bf16)", layers=["every layer"],
            assumptions=["bf16 optimizer states and weight updates converge for this model (not predicted; "
                         "usually needs stochastic rounding or Kahan summation)"],
        ))
    if fp32 and not base.timing.tf32_matmul and "tf32" in gpu.tensor_tflops and _has_fp32_matmuls(base):
        out.append(Candidate(
            name="tf32", family="precision", title="TF32 tensor cores for fp32 matmuls",
            change=Change(tf32=True), how="torch.backends.cuda.matmul.allow_tf32 = True",
            layers=sorted({t.module for t in base.prediction.step.ops if t.category == cat.GEMM})[:5],
            assumptions=["convolutions already use TF32 (cuDNN's default)",
                         "TF32's 10-bit mantissa is accurate enough (not predicted)"],
        ))
    if "fp8" in gpu.tensor_tflops and _FP8 is not None and step.train and not step.fp8:
        amp = () if step.amp or step.dtype in ("bf16", "fp16") else (("amp", "bf16"),)
        out.append(Candidate(
            name="fp8-linears", family="precision",
            title="FP8 linear layers (those large enough to gain)" + (" on top of AMP bf16" if amp else ""),
            change=Change(trace=amp, fp8=True),
            how="torchao.float8.convert_to_float8_training(model)  # dynamic tensorwise scaling",
            layers=[],
            assumptions=["each converted GEMM first casts its two operands to fp8 (one read of "
                         "each in 16 bits for the scale, one read and an fp8 write for the cast)",
                         "only linear GEMMs that gain after the casts are converted; outputs stay 16-bit",
                         "accuracy unchanged (not predicted)"],
        ))
    return out


def _torch(dtype: str) -> str:
    return {"bf16": "bfloat16", "fp16": "float16"}[dtype]


def _has_fp32_matmuls(base: Base) -> bool:
    return any(gt.estimate.rate_dtype == "fp32" for t in base.prediction.step.ops
               if t.category == cat.GEMM for gt in t.gemms)


def rewrite_fp8(rw: Rewritten, gpu: GPU, profile: DeviceProfile) -> None:
    """Convert each linear GEMM op that gains at the FP8 rate (after its casts)."""
    edits: dict[int, list] = {}
    converted = 0
    for c in rw.counts:
        if c.category != cat.GEMM or not c.gemms or any(g.role not in _WEIGHT_ROLES for g in c.gemms):
            continue
        if any(g.dtype not in ("bf16", "fp16") for g in c.gemms):
            continue
        now = sum(estimate_gemm(g.m, g.n, g.k, batch=g.batch, dtype=g.dtype, gpu=gpu, profile=profile).time_s
                  for g in c.gemms)
        fp8 = sum(estimate_gemm(g.m, g.n, g.k, batch=g.batch, dtype="fp8", gpu=gpu, profile=profile).time_s
                  for g in c.gemms)
        operands = [m for m in c.event.inputs if len(m.shape) >= 2]
        cast_bytes = sum(m.numel * (2 * m.itemsize + 1) for m in operands)  # amax read, cast read, fp8 write
        # (the cast ops below count one read and the write; the amax read is in this test only)
        cast_s = profile.memory_time(gpu.memory_bandwidth, cast_bytes) + len(operands) * profile.kernel_overhead_s
        if fp8 + cast_s >= now:
            continue
        ev = c.event
        casts = [synthetic(ev, torch.ops.aten._to_copy.default, (m,), [m], [with_dtype(m, _FP8)])
                 for m in operands]
        gemm_ev = synthetic(ev, ev.func, ev.args, [with_dtype(m, _FP8) if len(m.shape) >= 2 else m
                                                   for m in ev.inputs], ev.outputs)
        edits[ev.index] = count_events(rw.trace, [*casts, gemm_ev])
        rw.touched.add(ev.module)
        converted += 1
    if edits:
        rw.trace, rw.counts = rebuild(rw.trace, rw.counts, edits)
    rw.notes.append(f"{converted} linear GEMM ops converted to fp8")
