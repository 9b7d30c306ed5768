"""``nnperf bench transfer``: background.md point 4, measured and predicted.

n x n fp32 matrix products over a sweep of n:
  (a) on the CPU with NumPy (BLAS), data in host memory;
  (b) on the GPU with both operands and the result resident in device memory;
  (c) on the GPU including copying both operands to the device and the result back, each time
      (pageable host memory, as a NumPy program would have it).
The crossover sizes are the smallest n of the sweep from which the GPU column stays faster
than the CPU column for every larger n.

Predictions: ``kernels.transfer.predict_gpu`` (the GEMM model plus three copies over the
host link and their host dispatch). CPU = ``estimate_gemm`` on a calibrated CPU description
(``nnperf calibrate --device cpu``) when one is given, else measured only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from nnperf.hardware import GPU, DeviceProfile, default_profile
from nnperf.kernels.gemm import estimate_gemm
from nnperf.kernels.transfer import FALLBACK_LINK_GBS, TRANSFER_LATENCY_S, predict_gpu
from nnperf.measure.device import time_batched, time_repeats
from nnperf.measure.stats import Spread

DEFAULT_SIZES = (32, 64, 128, 200, 256, 512, 1024, 2048)



@dataclass
class TransferRow:
    n: int
    cpu_s: float | None = None
    gpu_resident_s: float | None = None
    gpu_with_copies_s: float | None = None
    predicted_cpu_s: float | None = None
    predicted_gpu_resident_s: float | None = None
    predicted_gpu_with_copies_s: float | None = None
    spreads: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))


def crossover(sizes: Sequence[int], cpu: Sequence[float | None], other: Sequence[float | None]) -> int | None:
    """Smallest n from which ``other`` is faster than ``cpu`` for that n and every larger n."""
    found = None
    for n, c, o in zip(reversed(sizes), reversed(cpu), reversed(other), strict=True):
        if c is None or o is None or o >= c:
            break
        found = n
    return found


def run_transfer_bench(
    sizes: Sequence[int],
    *,
    gpu: GPU,
    profile: DeviceProfile | None = None,
    cuda: torch.device | None = None,
    cpu_gpu: GPU | None = None,
    cpu_profile: DeviceProfile | None = None,
    repeats: int = 5,
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Measure (a), (b) and (c) where possible and predict each; returns a JSON-ready dict."""
    profile = profile or default_profile(gpu)
    rows = []
    rng = np.random.default_rng(0)
    for i, n in enumerate(sorted(sizes), 1):
        row = TransferRow(n=n)
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        cpu_times = time_batched(lambda a=a, b=b: a @ b, torch.device("cpu"), repeats=repeats)
        row.cpu_s = Spread.of(cpu_times).median
        row.spreads["cpu"] = Spread.of(cpu_times).to_json()
        if cuda is not None:
            da, db = torch.from_numpy(a).to(cuda), torch.from_numpy(b).to(cuda)
            resident = time_batched(lambda da=da, db=db: torch.mm(da, db), cuda, repeats=repeats)
            row.gpu_resident_s = Spread.of(resident).median
            row.spreads["gpu_resident"] = Spread.of(resident).to_json()
            ta, tb = torch.from_numpy(a), torch.from_numpy(b)

            def with_copies(ta: torch.Tensor = ta, tb: torch.Tensor = tb) -> np.ndarray:
                return torch.mm(ta.to(cuda), tb.to(cuda)).cpu().numpy()

            copies = time_repeats(with_copies, cuda, warmup=3, repeats=max(repeats, 5))
            row.gpu_with_copies_s = Spread.of(copies).median
            row.spreads["gpu_with_copies"] = Spread.of(copies).to_json()
        row.predicted_gpu_resident_s, row.predicted_gpu_with_copies_s = predict_gpu(n, gpu, profile)
        if cpu_gpu is not None:
            row.predicted_cpu_s = estimate_gemm(
                n, n, n, dtype="fp32", gpu=cpu_gpu, profile=cpu_profile or default_profile(cpu_gpu)
            ).time_s
        rows.append(row)
        if progress:
            progress(i)
    ns = [r.n for r in rows]
    measured_cpu = [r.cpu_s for r in rows]
    predicted_cpu = [r.predicted_cpu_s if r.predicted_cpu_s is not None else r.cpu_s for r in rows]
    result = {
        "schema": "nnperf.bench.transfer/1",
        "gpu": gpu.id,
        "gpu_name": gpu.name,
        "measured_on_gpu": torch.cuda.get_device_name(cuda) if cuda is not None else None,
        "cpu_prediction": "calibrated" if cpu_gpu is not None else "none (measured CPU times used)",
        "transfer_latency_s": TRANSFER_LATENCY_S,
        "host_link_gbs": gpu.host_link.gbs_per_direction if gpu.host_link else FALLBACK_LINK_GBS,
        "rows": [r.to_json() for r in rows],
        "crossover": {
            "measured_resident": crossover(ns, measured_cpu, [r.gpu_resident_s for r in rows]) if cuda else None,
            "measured_with_copies": crossover(ns, measured_cpu, [r.gpu_with_copies_s for r in rows]) if cuda else None,
            "predicted_resident": crossover(ns, predicted_cpu, [r.predicted_gpu_resident_s for r in rows]),
            "predicted_with_copies": crossover(ns, predicted_cpu, [r.predicted_gpu_with_copies_s for r in rows]),
        },
        "note": None if cuda is not None else (
            "no CUDA GPU on this machine: only the CPU column is measured; the GPU columns are "
            f"nnperf's predictions for {gpu.name}"
        ),
    }
    return result
