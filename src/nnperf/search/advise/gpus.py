"""The GPU: the same traced step on the other catalog GPUs, with cost per million samples.

The rows are ``nnperf compare``'s (``search.gpu_costs.gpu_row``): the same step timed on each
GPU, its memory model per architecture, and the price of a million samples where it fits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nnperf.hardware import list_gpus
from nnperf.search.advise.change import Candidate, Change

if TYPE_CHECKING:
    from nnperf.search.advise.evaluate import Base


def candidates(base: Base) -> list[Candidate]:
    out = []
    for gpu in list_gpus():
        if gpu.id == base.gpu.id or gpu.vendor != "NVIDIA" or ("bf16" not in gpu.supported_dtypes() \
                and base.options.trace.amp == "bf16"):
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
