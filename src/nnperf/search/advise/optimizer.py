"""The optimizer's implementation (for-loop, foreach, fused) and ``zero_grad(set_to_none)``.

Each implementation is traced: the for-loop runs a handful of kernels per parameter, foreach
one per group of tensors, fused one per parameter group (``_fused_adamw_``), so their host
dispatch and launches differ while the bytes they move do not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nnperf.search.advise.change import Candidate, Change

if TYPE_CHECKING:
    from nnperf.search.advise.evaluate import Base

#: nnperf's name of each implementation -> (how users call it, the constructor flag).
IMPLS = {
    "single": ("for-loop", "foreach=False"),
    "foreach": ("foreach", "foreach=True"),
    "fused": ("fused", "fused=True"),
}
_CLASSES = {"adamw": "AdamW", "adam": "Adam", "sgd": "SGD", "sgd-momentum": "SGD"}


def candidates(base: Base) -> list[Candidate]:
    step = base.options.trace
    if not step.train or step.optimizer == "none":
        return []
    cls = _CLASSES[step.optimizer]
    out = []
    for impl, (label, flag) in IMPLS.items():
        if impl == step.optimizer_impl:
            continue
        out.append(Candidate(
            name=f"optimizer-{label}", family="optimizer", title=f"{label} {cls} implementation",
            change=Change(trace=(("optimizer_impl", impl),)),
            how=f"torch.optim.{cls}(model.parameters(), ..., {flag})   (nnperf: --optimizer-impl {impl})",
            layers=["(optimizer)"],
            assumptions=["same update arithmetic; only kernels and host dispatch differ"],
        ))
    if base.options.set_to_none:
        base.checked.append(("zero-grad-set-to-none", "already optimizer.zero_grad(set_to_none=True) "
                                                      "(PyTorch's default since 2.0)"))
    else:
        out.append(Candidate(
            name="zero-grad-set-to-none", family="optimizer", title="zero_grad(set_to_none=True)",
            change=Change(trace=(("set_to_none", True),)),
            how="optimizer.zero_grad(set_to_none=True)", layers=["(optimizer)"],
            assumptions=["the step starts without gradients allocated (memory); the memset "
                         "zero_grad(set_to_none=False) runs between steps is not in the traced step"],
        ))
    return out
