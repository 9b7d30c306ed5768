"""Device memory outside the tensors of the step: CUDA context and library workspaces.

Why separate from "allocated": ``nvidia-smi`` shows more than ``torch.cuda.memory_reserved()``
because the CUDA context (kernel images, driver state) and some library state live outside
the caching allocator. These terms are estimates, each labeled, never a flat percentage.
"""

from __future__ import annotations

from nnperf.passes.memory.allocator import KB, MB

#: CUDA context per architecture, MiB. nnperf's defaults for CUDA 12 with lazy module loading
#: (``CUDA_MODULE_LOADING=LAZY``, the default since CUDA 11.7) and PyTorch's kernels; it grows
#: with the number of kernels actually loaded. Unverified against measurements in this
#: release: override with ``--context-mib`` once measured on the target machine
#: (``nvidia-smi`` used memory minus ``torch.cuda.memory_reserved()`` after a warm step).
CONTEXT_MIB: dict[str, int] = {
    "Kepler": 300,
    "Pascal": 350,
    "Volta": 400,
    "Turing": 400,
    "Ampere": 500,
    "Ada": 500,
    "Ada Lovelace": 500,
    "Hopper": 550,
    "Blackwell": 600,
}
DEFAULT_CONTEXT_MIB = 512  # unknown or non-NVIDIA architectures (ROCm's runtime is similar)

#: PyTorch's default cuBLAS workspace per (handle, stream): ``:4096:2:16:8`` (2 x 4 MiB +
#: 8 x 16 KiB) before Hopper, ``:4096:8`` (32 MiB) on Hopper and later
#: (``aten/src/ATen/cuda/CublasHandlePool.cpp``). It is allocated through the caching
#: allocator on the first GEMM of a thread, so it shows up in "allocated"; the autograd
#: engine runs backward on its own thread, hence a second workspace in training.
CUBLAS_WORKSPACE_DEFAULT = 2 * 4096 * KB + 8 * 16 * KB
CUBLAS_WORKSPACE_HOPPER = 8 * 4096 * KB
_HOPPER_OR_LATER = {"Hopper", "Blackwell"}

#: Ops that run on cuBLAS (and so create the workspace of the thread that calls them).
CUBLAS_OPS = {
    "aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm", "aten.addbmm", "aten._addmm_activation",
    "aten.addmv", "aten.mv", "aten.dot", "aten._scaled_mm", "aten.matmul", "aten.linear",
}
CONV_OPS = {"aten.convolution", "aten.convolution_backward", "aten._convolution",
            "aten.cudnn_convolution", "aten.convolution_overrideable"}


def context_bytes(architecture: str | None, override_mib: float | None = None) -> int:
    """The CUDA context estimate for an architecture (or the user's measured value)."""
    if override_mib is not None:
        return int(override_mib * MB)
    return CONTEXT_MIB.get(architecture or "", DEFAULT_CONTEXT_MIB) * MB


def cublas_workspace_bytes(architecture: str | None) -> int:
    return CUBLAS_WORKSPACE_HOPPER if architecture in _HOPPER_OR_LATER else CUBLAS_WORKSPACE_DEFAULT
