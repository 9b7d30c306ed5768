"""Per-architecture facts: one table, every NVIDIA catalog GPU in it."""

from __future__ import annotations

from nnperf.hardware import list_gpus
from nnperf.hardware.architecture import (
    ARCHITECTURES,
    CUBLAS_WORKSPACE_DEFAULT,
    CUBLAS_WORKSPACE_HOPPER,
    architecture,
)


def test_every_nvidia_catalog_gpu_has_a_row():
    for gpu in list_gpus():
        if gpu.vendor.upper() == "NVIDIA":
            assert gpu.arch.name in ARCHITECTURES, gpu.id


def test_cublas_workspace_sizes_are_pytorchs_defaults():
    # CublasHandlePool.cpp: ":4096:2:16:8" (KiB x count) before Hopper, ":4096:8" from Hopper on
    assert CUBLAS_WORKSPACE_DEFAULT == 2 * 4 * 2**20 + 8 * 16 * 2**10
    assert CUBLAS_WORKSPACE_HOPPER == 32 * 2**20
    assert architecture("Ampere").cublas_workspace_bytes == CUBLAS_WORKSPACE_DEFAULT
    assert architecture("Hopper").cublas_workspace_bytes == CUBLAS_WORKSPACE_HOPPER


def test_128_byte_preference_from_ampere_on():
    assert not architecture("Volta").prefers_128_byte_alignment
    assert not architecture("Turing").prefers_128_byte_alignment
    for name in ("Ampere", "Ada Lovelace", "Ada", "Hopper", "Blackwell"):
        assert architecture(name).prefers_128_byte_alignment, name


def test_unknown_architecture_falls_back_on_compute_capability():
    assert architecture("Rubin", "11.0").prefers_128_byte_alignment
    assert not architecture("CDNA3", "gfx942").prefers_128_byte_alignment
    assert architecture(None).context_mib == architecture("CDNA3").context_mib
