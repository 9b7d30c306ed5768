"""Device memory outside the tensors of the step: CUDA context and library workspaces.

Why separate from "allocated": ``nvidia-smi`` shows more than ``torch.cuda.memory_reserved()``
because the CUDA context (kernel images, driver state) and some library state live outside
the caching allocator. These terms are estimates, each labeled, never a flat percentage.
"""

from __future__ import annotations

from nnperf.hardware.architecture import architecture
from nnperf.passes.memory.allocator import MB

#: Ops that run on cuBLAS (and so create the workspace of the thread that calls them).
CUBLAS_OPS = {
    "aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm", "aten.addbmm", "aten._addmm_activation",
    "aten.addmv", "aten.mv", "aten.dot", "aten._scaled_mm", "aten.matmul", "aten.linear",
}
CONV_OPS = {"aten.convolution", "aten.convolution_backward", "aten._convolution",
            "aten.cudnn_convolution", "aten.convolution_overrideable"}


def context_bytes(name: str | None, override_mib: float | None = None) -> int:
    """The CUDA context estimate for an architecture (or the user's measured value)."""
    if override_mib is not None:
        return int(override_mib * MB)
    return architecture(name).context_mib * MB


def cublas_workspace_bytes(name: str | None) -> int:
    """The cuBLAS workspace one thread's first GEMM allocates (``hardware.architecture``)."""
    return architecture(name).cublas_workspace_bytes
