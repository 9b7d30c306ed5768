"""Models by library name: ``hf:ID`` (Hugging Face transformers, from its config, no weights),
``timm:NAME`` and ``tv:NAME`` (torchvision), built into a ``Workload`` like a zoo model.

Each library is an optional dependency (``pip install 'nnperf[hf]'``, ``nnperf[timm]``,
``nnperf[vision]``) imported only when one of its models is asked for, so nnperf itself
still needs nothing but torch. The prefixes are checked before ``PATH.py:FACTORY``: a factory
in a module named ``hf`` would have to be spelled ``./hf.py:FACTORY``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nnperf.workload import Workload

#: prefix -> (library, module of nnperf.hub that builds its models)
PREFIXES: dict[str, tuple[str, str]] = {
    "hf": ("Hugging Face transformers", "huggingface"),
    "timm": ("timm", "timm_models"),
    "tv": ("torchvision", "torchvision_models"),
}

#: Hugging Face task heads (``--task``), each with its inputs and loss (``hub.hf_tasks``).
HF_TASKS = ("causal-lm", "masked-lm", "seq2seq-lm", "speech-seq2seq", "seq-cls", "token-cls",
            "image-cls", "base")
#: Attention implementations a Hugging Face model can be traced with (flash-attention-2 and
#: others need CUDA kernels from other packages, which run on no fake tensor).
ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flex_attention")


@dataclass(frozen=True)
class HubRequest:
    """What a hub builder needs: the name after the prefix and the request's settings."""

    name: str
    batch: int | None
    seq_len: int | None
    overrides: dict[str, Any]
    task: str | None = None
    attn_implementation: str | None = None


def split(target: str) -> tuple[str, str] | None:
    """``"hf:gpt2"`` -> ``("hf", "gpt2")``; None when ``target`` names no library."""
    prefix, sep, name = target.partition(":")
    if sep and prefix in PREFIXES:
        return prefix, name
    return None


def builder(prefix: str, request: HubRequest) -> tuple[str, Callable[[], Workload]]:
    """A display name and a zero-argument builder (called inside the tracing context).

    What can be checked without building (a known name, the library importable, a config
    found) is checked here, so a bad name fails before any tracing starts.
    """
    import importlib

    module = importlib.import_module(f"nnperf.hub.{PREFIXES[prefix][1]}")
    return module.builder(request)
