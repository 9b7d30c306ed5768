"""One host<->device copy over the GPU's host link, and the background's n x n product with
and without copies (point 4: copying operands each time erases the GPU's gain).

A copy costs a fixed latency plus its bytes at the link's achievable bandwidth per direction
(the catalog's ``host_link``).
"""

from __future__ import annotations

from nnperf.hardware import GPU, DeviceProfile
from nnperf.kernels.gemm import estimate_gemm

#: Fixed cost of one cudaMemcpy of pageable memory (driver call, staging, PCIe round trip):
#: ~10 us is typical of PCIe systems (NVIDIA's bandwidthTest small transfers). Assumption.
TRANSFER_LATENCY_S = 10e-6
#: Used when a GPU entry has no host link: PCIe 4.0 x16, ~25 GB/s achievable. Assumption.
FALLBACK_LINK_GBS = 25.0


def copy_time(nbytes: float, gpu: GPU, latency_s: float = TRANSFER_LATENCY_S) -> float:
    """Predicted seconds of one host<->device copy of ``nbytes`` over the GPU's host link."""
    gbs = gpu.host_link.gbs_per_direction if gpu.host_link else FALLBACK_LINK_GBS
    return latency_s + nbytes / (gbs * 1e9)


def predict_gpu(n: int, gpu: GPU, profile: DeviceProfile) -> tuple[float, float]:
    """(resident, with copies) predicted seconds for one n x n fp32 product on ``gpu``."""
    resident = estimate_gemm(n, n, n, dtype="fp32", gpu=gpu, profile=profile).time_s
    nbytes = n * n * 4
    copies = 3 * copy_time(nbytes, gpu)
    host = 4 * profile.host_dispatch_s  # three copies and the product issued from the host
    return resident + profile.host_dispatch_s, resident + copies + host
