"""Facts that belong to a GPU architecture rather than to one card.

A catalog entry (``gpus/*.toml``) names its architecture; everything the models need to know
about that architecture lives in the one table below, so adding a GPU is one TOML file and
adding an architecture is one more row here. Each value states its source or says it is an
assumption.
"""

from __future__ import annotations

from dataclasses import dataclass

from nnperf.errors import UsageError, shown

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
    #: CUDA context, MiB, with lazy module loading (``CUDA_MODULE_LOADING=LAZY``: CUDA 11.7+,
    #: which PyTorch 1.13+ sets when the user has not): only the kernels used get loaded, so it
    #: grows with them. Published readings: ~300 MB "small compared to previous releases"
    #: (ptrblck, pytorch/pytorch#107667), "around 400MB if CUDA >= 11.7 is used and lazy module
    #: loading enabled" (ptrblck, #109888), 426 MiB on an RTX 6000 Ada with PyTorch 2.10 +
    #: CUDA 13.0 before any cuBLAS/cuDNN call (unslothai/unsloth-zoo#1053), 274 MiB lazy vs
    #: 636 MiB eager for PyTorch's own kernels (pytorch/pytorch#86509). The per-architecture
    #: values below sit in that range plus cuBLAS/cuDNN kernels (assumption); ``context_mib_at``
    #: gives the size without lazy loading. Override with ``--context-mib`` once measured
    #: (``nvidia-smi`` used memory minus ``torch.cuda.memory_reserved()`` after a warm step).
    context_mib: int
    #: cuBLAS workspace per thread that runs GEMMs (see the constants above).
    cublas_workspace_bytes: int = CUBLAS_WORKSPACE_DEFAULT
    #: Tensor-core GEMMs run best with every dimension a multiple of 128 bytes, not only 16
    #: (A100 and later: NVIDIA's "Matrix Multiplication Background User's Guide", and
    #: background.md point 2).
    prefers_128_byte_alignment: bool = False

    def context_mib_at(self, cuda_version: str | None) -> int:
        """The context under CUDA ``cuda_version`` ("11.3", "12.4"; None: a current stack,
        lazy). Before 11.7 every kernel of PyTorch, cuBLAS and cuDNN is loaded when the
        context is created: at least ``EAGER_CONTEXT_MIB``."""
        if cuda_version is None or lazy_loading(cuda_version):
            return self.context_mib
        return max(self.context_mib, EAGER_CONTEXT_MIB)


#: CUDA 11.7 introduced lazy module loading (CUDA C++ Programming Guide, "Lazy Loading"), and
#: PyTorch turns it on by default from 1.13 (pytorch/pytorch#86509).
LAZY_LOADING_SINCE = (11, 7)
#: The context without lazy loading: "Before CUDA 11.7, *all* kernels were loaded into the
#: context once the library was loaded, which took >1000MB" (ptrblck, pytorch/pytorch#107667);
#: cuDNN v7's handle alone took 750 MB on a GTX 1070 (pytorch/pytorch#12873). The lower bound
#: of those readings; an eager CUDA 11 context with cuDNN 8 can be larger (measure it).
EAGER_CONTEXT_MIB = 1024


def lazy_loading(cuda_version: str) -> bool:
    """Whether CUDA ``cuda_version`` ("MAJOR.MINOR") loads modules lazily (11.7 and later)."""
    parts = cuda_version.strip().split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
        raise UsageError(f"CUDA version {shown(cuda_version)} is not MAJOR.MINOR, e.g. 11.3 or 12.4")
    return (int(parts[0]), int(parts[1])) >= LAZY_LOADING_SINCE


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


#: Resident threads and blocks per SM by compute capability (CUDA C++ Programming Guide,
#: "Technical Specifications per Compute Capability": maximum resident threads / blocks per
#: SM): 2048 threads on 5.x-7.0, 8.0, 8.7, 9.0 and 10.x; 1024 on 7.5 (Turing); 1536 on 8.6,
#: 8.9 and 12.x (GeForce Ampere, Ada, Blackwell); 32 blocks, 16 on 7.5 and 8.6, 24 on 8.9.
_RESIDENT_BY_CC: dict[str, tuple[int, int]] = {
    "7.5": (1024, 16), "8.6": (1536, 16), "8.9": (1536, 24), "12.0": (1536, 32), "12.1": (1536, 32),
}
#: Other NVIDIA parts (and AMD CDNA, whose compute units hold 32 wavefronts of 64 = 2048
#: threads): 2048 threads, 32 blocks.
DEFAULT_RESIDENT = (2048, 32)


def resident_limits(compute_capability: str | None) -> tuple[int, int]:
    """(threads, blocks) one SM holds at once for ``compute_capability`` ("9.0")."""
    return _RESIDENT_BY_CC.get((compute_capability or "").strip(), DEFAULT_RESIDENT)


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
