"""Facts that belong to a GPU architecture rather than to one card.

A catalog entry (``gpus/*.toml``) names its architecture; everything the models need to know
about that architecture lives in the one table below, so adding a GPU is one TOML file and
adding an architecture is one more row here. Each value states its source or says it is an
assumption.
"""

from __future__ import annotations

from dataclasses import dataclass

KIB = 1024
MIB = 1024 * KIB

#: PyTorch's default cuBLAS workspace per (handle, stream): ``:4096:2:16:8`` (2 x 4 MiB +
#: 8 x 16 KiB) before Hopper, ``:4096:8`` (32 MiB) on Hopper and later
#: (``aten/src/ATen/cuda/CublasHandlePool.cpp``). It is allocated through the caching
#: allocator on the first GEMM of a thread, so it shows up in "allocated"; the autograd
#: engine runs backward on its own thread, hence a second workspace in training.
CUBLAS_WORKSPACE_DEFAULT = 2 * 4096 * KIB + 8 * 16 * KIB
CUBLAS_WORKSPACE_HOPPER = 8 * 4096 * KIB


@dataclass(frozen=True)
class Architecture:
    """One GPU architecture as the time and memory models see it."""

    name: str
    #: CUDA context, MiB. nnperf's defaults for CUDA 12 with lazy module loading
    #: (``CUDA_MODULE_LOADING=LAZY``, the default since CUDA 11.7) and PyTorch's kernels; it
    #: grows with the number of kernels actually loaded. Unverified against measurements:
    #: override with ``--context-mib`` once measured on the target machine (``nvidia-smi``
    #: used memory minus ``torch.cuda.memory_reserved()`` after a warm step).
    context_mib: int
    #: cuBLAS workspace per thread that runs GEMMs (see the constants above).
    cublas_workspace_bytes: int = CUBLAS_WORKSPACE_DEFAULT
    #: Tensor-core GEMMs run best with every dimension a multiple of 128 bytes, not only 16
    #: (A100 and later: NVIDIA's "Matrix Multiplication Background User's Guide", and
    #: background.md point 2).
    prefers_128_byte_alignment: bool = False


ARCHITECTURES: dict[str, Architecture] = {
    a.name: a
    for a in (
        Architecture("Kepler", context_mib=300),
        Architecture("Pascal", context_mib=350),
        Architecture("Volta", context_mib=400),
        Architecture("Turing", context_mib=400),
        Architecture("Ampere", context_mib=500, prefers_128_byte_alignment=True),
        Architecture("Ada Lovelace", context_mib=500, prefers_128_byte_alignment=True),
        Architecture("Hopper", context_mib=550, cublas_workspace_bytes=CUBLAS_WORKSPACE_HOPPER,
                     prefers_128_byte_alignment=True),
        Architecture("Blackwell", context_mib=600, cublas_workspace_bytes=CUBLAS_WORKSPACE_HOPPER,
                     prefers_128_byte_alignment=True),
    )
}
ALIASES = {"Ada": "Ada Lovelace"}

#: Unknown or non-NVIDIA architectures (AMD CDNA: ROCm's runtime context is of the same
#: order; rocBLAS keeps no workspace in the caching allocator by default). Assumption.
UNKNOWN_CONTEXT_MIB = 512


def architecture(name: str | None, compute_capability: str | None = None) -> Architecture:
    """The table's row for ``name``. An architecture the table does not know gets the
    assumed context size and, for an NVIDIA compute capability of 8 or more (what Ampere
    and later report), the 128-byte alignment preference."""
    key = ALIASES.get(name or "", name or "")
    if key in ARCHITECTURES:
        return ARCHITECTURES[key]
    major = (compute_capability or "").split(".")[0]
    return Architecture(
        name or "unknown",
        context_mib=UNKNOWN_CONTEXT_MIB,
        prefers_128_byte_alignment=major.isdigit() and int(major) >= 8,
    )
