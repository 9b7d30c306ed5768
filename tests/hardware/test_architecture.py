"""Per-architecture facts: one table, every NVIDIA catalog GPU in it."""

from __future__ import annotations

import pytest

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


def test_context_without_lazy_loading_before_cuda_11_7():
    from nnperf.errors import UsageError
    from nnperf.hardware.architecture import EAGER_CONTEXT_MIB, architecture, lazy_loading

    assert not lazy_loading("11.6") and lazy_loading("11.7") and lazy_loading("12.4")
    volta = architecture("Volta")
    assert volta.context_mib_at(None) == volta.context_mib == volta.context_mib_at("12.1")
    assert volta.context_mib_at("11.3") == EAGER_CONTEXT_MIB == 1024  # ">1000MB" (ptrblck, #107667)
    with pytest.raises(UsageError, match=r"'11' is not MAJOR\.MINOR"):
        lazy_loading("11")


def test_memory_cuda_version_option():
    import json

    from click.testing import CliRunner

    from nnperf.cli.app import cli

    def terms(*extra: str) -> dict:
        r = CliRunner().invoke(cli, ["memory", "mlp", "--gpu", "v100", "--json", *extra])
        assert r.exit_code == 0, r.output
        return json.loads(r.output)["memory"]

    old, new = terms("--cuda-version", "11.3"), terms()
    context = "CUDA context (estimate per architecture)"
    assert old["device_terms"][context] == 1024 * 2**20 and new["device_terms"][context] == 400 * 2**20
    assert old["device_total"] - new["device_total"] == (1024 - 400) * 2**20
    measured = terms("--cuda-version", "11.3", "--context-mib", "700")  # a measurement wins
    assert measured["device_terms"][context] == 700 * 2**20
