"""What the library builders share: importing an optional library with one clear line when it
is missing or broken, and the image-classification workload timm and torchvision models get."""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Iterable
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from nnperf.errors import ModelLoadError, UsageError, shown
from nnperf.workload import Workload
from nnperf.zoo._losses import random_classes

#: module -> the nnperf extra that installs it
EXTRAS = {"transformers": "hf", "timm": "timm", "torchvision": "vision"}


def require(module: str, what: str) -> ModuleType:
    """``import module`` for ``what`` (``"hf:gpt2"``), or one line saying what to install."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name is not None and err.name.split(".")[0] not in (module, "torchvision"):
            raise ModelLoadError(f"{what} needs {module}, whose import failed: {err}") from None
        if err.name == module:
            raise ModelLoadError(f"{what} needs {module}, which is not installed: "
                                 f"pip install 'nnperf[{EXTRAS[module]}]'") from None
        raise ModelLoadError(f"{what} needs {module}, which needs torchvision, not installed: "
                             f"{_pair_advice()}") from None
    except Exception as err:  # a broken install raises anything
        text = " ".join(str(err).split())[:200]
        if module in ("torchvision", "timm") or "torchvision" in text:
            raise ModelLoadError(f"{what} needs {module}, but it cannot be imported with torch "
                                 f"{torch.__version__} ({type(err).__name__}: {text}): "
                                 f"{_pair_advice()}") from None
        raise ModelLoadError(f"{what} needs {module}, but importing it failed: "
                             f"{type(err).__name__}: {text}") from None


def _pair_advice() -> str:
    """How to get a torchvision that loads with the installed torch: both installed together
    from one index, so pip picks a build of each for the other. PyTorch's table
    (https://github.com/pytorch/vision#installation) pairs torch 2.m with torchvision
    0.(m+15); a CPU-only torch (``+cpu``) needs torchvision from the same CPU index."""
    major, minor = (int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    pair = f"torchvision 0.{minor + 15}" if major == 2 else "the torchvision release"
    if "+cpu" in torch.__version__:
        return (f"install {pair} from the same CPU index as torch (pip install torchvision "
                "--index-url https://download.pytorch.org/whl/cpu), or install the default "
                "torch and torchvision together (pip install torch torchvision)")
    return (f"install {pair} (its release for torch {major}.{minor}), or torch and torchvision "
            "together (pip install --upgrade torch torchvision)")


def unknown_name(what: str, name: str, known: Iterable[str], listing: str) -> ModelLoadError:
    """``unknown timm model 'convnxt_tiny'; did you mean convnext_tiny?``"""
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}?" if close else f"see {listing}"
    return ModelLoadError(f"unknown {what} {shown(name)}; {hint}")


def refuse_seq(target: str, seq_len: int | None) -> None:
    if seq_len is not None:
        raise UsageError(f"--seq {seq_len} is not used: {target} is an image model; "
                         "its input size is the library's own (use -O to change the model)")


def image_workload(name: str, model: nn.Module, batch: int, input_size: tuple[int, int, int],
                   num_classes: int, info: dict[str, Any]) -> Workload:
    """(batch, C, H, W) images and cross entropy against random labels, as an ImageNet
    training loop (timm's train.py, torchvision's references) runs the model."""
    x = torch.randn(batch, *input_size)
    loss = ClassifierLoss(random_classes(batch, num_classes)) if num_classes > 0 else None
    info = {"image_size": list(input_size[1:]), "num_classes": num_classes, **info}
    return Workload(model, (x,), loss, samples=batch, name=name, info=info)


class ClassifierLoss:
    """Cross entropy of the logits against fixed random labels. A model that also returns
    auxiliary classifiers' logits in training (torchvision's Inception v3 and GoogLeNet, a
    named tuple of logits) gets one cross entropy per head, summed: the papers weight the
    auxiliary losses (0.3, 0.4), which changes values, not work."""

    def __init__(self, targets: torch.Tensor) -> None:
        self.targets = targets

    def __call__(self, output: Any) -> torch.Tensor:
        heads = [output] if isinstance(output, torch.Tensor) else [
            t for t in output if isinstance(t, torch.Tensor)]
        targets = self.targets.to(heads[0].device)
        loss = F.cross_entropy(heads[0], targets)
        for logits in heads[1:]:
            loss = loss + F.cross_entropy(logits, targets)
        return loss

    def __repr__(self) -> str:
        return f"ClassifierLoss(targets={tuple(self.targets.shape)})"
