"""The GPU: the same traced step on the other catalog GPUs, with cost per million samples.

The rows are ``nnperf compare``'s (``search.gpu_costs.gpu_row``): the same step timed on each
GPU, its memory model per architecture, and the price of a million samples where it fits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nnperf.hardware import GPU, list_gpus
from nnperf.search.advise.change import Candidate, Change

if TYPE_CHECKING:
    from nnperf.search.advise.evaluate import Base


def candidates(base: Base) -> list[Candidate]:
    out = []
    for gpu in list_gpus():
        if gpu.id == base.gpu.id or _left_out(base, gpu):
            continue
        out.append(Candidate(
            name=f"gpu-{gpu.id}", family="gpu", title=f"run on {gpu.name}",
            change=Change(gpu=gpu.id), how=f"--gpu {gpu.id}", layers=["the whole step"],
            assumptions=["same step, same software; the catalog's dated price per GPU-hour"
                         + (f" ({gpu.price_usd_per_hour} USD/h, {gpu.price_date})" if gpu.price_usd_per_hour else
                            " (no price in the catalog)")],
            extra={"usd_per_hour": gpu.price_usd_per_hour, "price_date": gpu.price_date},
        ))
    return out


def not_compared(base: Base) -> list[tuple[str, str]]:
    """The catalog GPUs left out of the table, each with why (``advise`` prints them, so a
    missing GPU is not read as one that lost)."""
    return [(gpu.id, why) for gpu in list_gpus() if gpu.id != base.gpu.id
            for why in [_left_out(base, gpu)] if why]


def _left_out(base: Base, gpu: GPU) -> str:
    """Why ``gpu`` is not compared ('' if it is)."""
    if gpu.vendor != "NVIDIA":
        # the step as given is a CUDA one (cuBLAS, cuDNN, CUDA graphs): another vendor's
        # library stack is another program; ``nnperf compare`` times it as the same step
        return (f"{gpu.vendor} GPUs, whose software is not the CUDA stack this table keeps; "
                "'nnperf compare --gpus NAME' times the step on them")
    if "bf16" not in gpu.supported_dtypes() and base.options.trace.amp == "bf16":
        return "no bf16, which --amp bf16 needs"
    return ""
