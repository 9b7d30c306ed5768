"""Hugging Face task heads (``--task``): which ``AutoModelFor...`` class, what labels a training
step passes, and which task a config names by default.

A training step runs the model the way a transformers training loop does,
``model(input_ids, labels=labels).loss``: the model computes its own loss (the logits' fp32
upcast, the shift of a causal LM, the ``-100`` handling, Mixtral's router loss when the config
asks for it), so the trace holds exactly its ops. The labels are passed by a forward pre-hook
only while gradients are enabled (``TrainingLabels``): an inference step (``torch.no_grad``)
runs the bare forward, without a loss, as inference code does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from nnperf.errors import ModelLoadError, UsageError


@dataclass(frozen=True)
class Task:
    """A task head: its Auto class, the mapping that says which model types have it, and the
    labels of a training step: ``inputs`` (a causal LM's labels are its input ids, shifted
    inside), ``tokens`` (one class per position from the vocabulary), ``decoder`` (a
    sequence-to-sequence model's target tokens), ``classes`` (one per sample), ``token-classes``
    (one per position) or None (no head: the loss is the sum of the last hidden state)."""

    auto_class: str
    mapping: str
    labels: str | None


TASKS: dict[str, Task] = {
    "causal-lm": Task("AutoModelForCausalLM", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "inputs"),
    "masked-lm": Task("AutoModelForMaskedLM", "MODEL_FOR_MASKED_LM_MAPPING_NAMES", "tokens"),
    "seq2seq-lm": Task("AutoModelForSeq2SeqLM", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "decoder"),
    "speech-seq2seq": Task("AutoModelForSpeechSeq2Seq", "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES", "decoder"),
    "seq-cls": Task("AutoModelForSequenceClassification",
                    "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES", "classes"),
    "token-cls": Task("AutoModelForTokenClassification",
                      "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES", "token-classes"),
    "image-cls": Task("AutoModelForImageClassification",
                      "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES", "classes"),
    "base": Task("AutoModel", "MODEL_MAPPING_NAMES", None),
}

#: When the config's ``architectures`` names no task head (``BartModel``,
#: ``BertForPreTraining``): the first task its model type has, sequence-to-sequence and
#: masked LM before causal LM (BERT has a causal-LM head too, not what it is trained with).
_FALLBACK = ("seq2seq-lm", "speech-seq2seq", "masked-lm", "causal-lm", "image-cls", "base")


def _mapping(task: str) -> dict[str, Any]:
    from transformers.models.auto import modeling_auto

    return getattr(modeling_auto, TASKS[task].mapping)


def _classes(value: Any) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


def tasks_of(model_type: str) -> list[str]:
    """The tasks transformers has a head for, for this model type."""
    return [t for t in TASKS if model_type in _mapping(t)]


def class_name(task: str, model_type: str) -> str:
    """The class ``task``'s Auto class builds for this model type (``LlamaForCausalLM``)."""
    return _classes(_mapping(task)[model_type])[0]


def choose_task(requested: str | None, config: Any, name: str) -> str:
    """``requested`` if the model type has that head, else the config's own (its
    ``architectures``), else the fallback order above."""
    model_type = config.model_type
    available = tasks_of(model_type)
    if requested is not None:
        if requested not in TASKS:
            raise UsageError(f"unknown --task {requested!r}; valid: {', '.join(TASKS)}")
        if requested not in available:
            raise UsageError(f"--task {requested}: hf:{name} ({model_type}) has no such head in "
                             f"transformers; its tasks: {', '.join(available) or 'none'}")
        return requested
    for arch in getattr(config, "architectures", None) or ():
        for task in TASKS:
            if task in available and arch in _classes(_mapping(task)[model_type]):
                return task
    for task in _FALLBACK:
        if task in available:
            return task
    raise ModelLoadError(f"hf:{name}: transformers has no model class for model_type {model_type!r}")


class TrainingLabels:
    """Forward pre-hook: while gradients are enabled (a training step) the model is called
    with ``labels=`` too, moved to the device of its first tensor input (as the zoo's losses
    move their targets), so it returns its own loss."""

    def __init__(self, labels: torch.Tensor) -> None:
        self.labels = labels

    def __call__(self, module: nn.Module, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        if not torch.is_grad_enabled() or "labels" in kwargs:
            return None
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), self.labels.device)
        return args, {**kwargs, "labels": self.labels.to(device)}

    def __repr__(self) -> str:
        return f"TrainingLabels(labels={tuple(self.labels.shape)})"


class OutputLoss:
    """The loss a transformers model returns when it was given labels."""

    def __call__(self, output: Any) -> torch.Tensor:
        loss = output.get("loss") if hasattr(output, "get") else None
        if loss is None:
            raise ValueError("the model returned no loss: it was not given labels")
        return loss

    def __repr__(self) -> str:
        return "OutputLoss()"


class HiddenStateSum:
    """No task head (``--task base``): the sum of the last hidden state, an assumption that
    backpropagates through the whole model at the cost of one reduction."""

    def __call__(self, output: Any) -> torch.Tensor:
        return output[0].sum()

    def __repr__(self) -> str:
        return "HiddenStateSum()"


def labels_for(task: str, config: Any, batch: int, seq: int, decoder_seq: int,
               input_ids: torch.Tensor | None) -> torch.Tensor | None:
    """The labels of a training step of ``task`` (None: no head)."""
    kind = TASKS[task].labels
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    classes = int(getattr(config, "num_labels", 2))
    if kind == "inputs":
        return input_ids
    if kind == "tokens":
        return torch.randint(0, vocab, (batch, seq))
    if kind == "decoder":
        return torch.randint(0, vocab, (batch, decoder_seq))
    if kind == "classes":
        return torch.randint(0, classes, (batch,))
    if kind == "token-classes":
        return torch.randint(0, classes, (batch, seq))
    return None
