"""Built-in models, written out in the project so nnperf needs no torchvision or transformers.

Each entry builds a ready-to-trace ``Workload`` (model, example inputs, training loss) with
ordinary torch calls, so the caller can build it under a ``FakeTensorMode`` and allocate
nothing, or for real to measure a small configuration.
"""

from __future__ import annotations

import difflib

from nnperf.errors import ModelLoadError

from . import (
    alexnet,
    alexnet_caffe,
    bert,
    bert_dle,
    convnext,
    deepseek,
    efficientnet,
    gpt2,
    llama,
    mlp,
    mnist,
    mobilenet,
    resnet,
    vgg,
    vit,
)
from ._spec import ModelSpec

__all__ = ["MODELS", "PRESETS", "ModelSpec", "get_model", "list_models"]

_ORDER: list[ModelSpec] = [
    mlp.SPEC,
    mnist.SPEC,
    alexnet.SPEC,
    alexnet_caffe.SPEC,
    vgg.SPEC,
    resnet.RESNET18,
    resnet.RESNET50,
    mobilenet.SPEC,
    *efficientnet.SPECS,
    convnext.SPEC,
    vit.SPEC,
    bert.SPEC,
    *bert_dle.SPECS,
    *gpt2.SPECS,
    llama.SPEC,
    *llama.PUBLISHED_SPECS,
    llama.MIXTRAL,
    deepseek.SPEC,
    *deepseek.PUBLISHED_SPECS,
]

MODELS: dict[str, ModelSpec] = {spec.name: spec for spec in _ORDER}
#: The published models at their shapes (``zoo._spec.Preset``), on the gpt2, llama and deepseek
#: families' classes.
PRESETS = frozenset(p.name for p in (*gpt2.PUBLISHED, *llama.PUBLISHED, *deepseek.PUBLISHED))


def _key(name: str) -> str:
    """Users type resnet-50, mobilenet-v2, VIT_B_16 or llama3_1-405b: ignore case, '-', '_', '.'
    and spaces."""
    return "".join(ch for ch in name.lower() if ch not in "-_. \t")


_BY_KEY: dict[str, ModelSpec] = {_key(name): spec for name, spec in MODELS.items()}
assert len(_BY_KEY) == len(MODELS), "two zoo names differ only in case or separators"


def get_model(name: str) -> ModelSpec:
    """The spec named ``name``, ignoring case and '-'/'_' (``resnet-50`` is ``resnet50``).

    An unknown name raises ``ModelLoadError`` suggesting the closest known names, because
    the usual cause is a typo (``resnet-5``, ``gpt2-mdium``).
    """
    spec = find_model(name)
    if spec is not None:
        return spec
    close = difflib.get_close_matches(_key(name), list(_BY_KEY), n=3, cutoff=0.5)
    if close:
        hint = "did you mean " + ", ".join(_BY_KEY[k].name for k in close) + "?"
    else:
        hint = "known models: " + ", ".join(MODELS)
    raise ModelLoadError(f"unknown model {name!r}; {hint}")


def find_model(name: object) -> ModelSpec | None:
    """The spec named ``name`` as ``get_model`` finds it, or None for anything that is not a
    built-in model's name (a library's ``hf:``/``timm:`` model, a file, a model object): for
    callers that only take a built-in's defaults where there is one."""
    return _BY_KEY.get(_key(name)) if isinstance(name, str) else None


def list_models(presets: bool = True) -> list[ModelSpec]:
    """All built-in models, smallest families first (the order a listing should show).
    ``presets=False`` leaves out the published models at their full shapes (``PRESETS``): each is
    a family's classes that another entry already builds, and none fits one GPU to be measured
    alone, so the single-GPU validation plans cover the family's own entries instead."""
    return [spec for spec in _ORDER if presets or spec.name not in PRESETS]
