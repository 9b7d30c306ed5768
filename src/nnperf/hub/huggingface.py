"""``hf:ID``: a transformers model built from its config (``AutoModelFor...from_config``) inside
the tracing context, so no weight is downloaded or allocated.

Inputs follow the model's ``main_input_name``: token ids (``--batch`` x ``--seq``), pixel
values at the config's ``image_size`` (ViT), log-mel input features of the length the encoder
requires (Whisper: ``2 * max_source_positions`` frames); an encoder-decoder model gets decoder
input ids too (``--seq`` long; Whisper's decoder defaults to its ``max_target_positions``).
``-O key=value`` sets a config field (``-O num_hidden_layers=2``); ``--task`` picks the head
(``hub.hf_tasks``), ``--attn-implementation`` transformers' attention (``eager``/``sdpa``;
default: transformers' own choice). The weights have the dtype ``from_config`` gives them:
transformers 5 builds in the config's ``dtype`` (bf16 for Llama-3.1), 4.x in fp32; ``--dtype``
casts.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from typing import Any

import torch

from nnperf.errors import ModelLoadError, ModelOptionError, UsageError, shown
from nnperf.hub import ATTN_IMPLEMENTATIONS, HubRequest
from nnperf.hub.common import require
from nnperf.hub.hf_config import config_value, find_config
from nnperf.hub.hf_tasks import (
    TASKS,
    HiddenStateSum,
    OutputLoss,
    TrainingLabels,
    choose_task,
    class_name,
    labels_for,
)
from nnperf.trace.construction import build_as_user_code
from nnperf.trace.limits import check_counts
from nnperf.workload import Workload

#: Batch and sequence length when not given: a fine-tuning run's size (zoo gpt2 also runs 8).
DEFAULT_BATCH = 8
DEFAULT_SEQ = 1024
#: Config fields that bound the sequence length (learned or rotary positions), in order.
_POSITION_FIELDS = ("max_position_embeddings", "n_positions", "max_target_positions")


def builder(request: HubRequest) -> tuple[str, Callable[[], Workload]]:
    target = f"hf:{request.name}"
    transformers = require("transformers", target)
    config, where = find_config(request.name, transformers)
    _override(config, request.overrides, target)
    task = choose_task(request.task, config, request.name)
    if request.attn_implementation not in (None, *ATTN_IMPLEMENTATIONS):
        raise UsageError(f"--attn-implementation {request.attn_implementation!r}: valid: "
                         f"{', '.join(ATTN_IMPLEMENTATIONS)}")
    batch = request.batch or DEFAULT_BATCH
    shapes = _input_plan(config, task, request.seq_len, target)
    auto = getattr(transformers, TASKS[task].auto_class)
    if task == "seq-cls" and getattr(config, "pad_token_id", None) is None:
        # a decoder-only classifier finds each row's last token by the pad id and refuses a
        # batch above 1 without one; users set it to the EOS id (the tokenizer's pad)
        eos = getattr(config, "eos_token_id", None)
        config.pad_token_id = (eos[0] if isinstance(eos, list | tuple) else eos) or 0

    def build() -> Workload:
        kwargs = {} if request.attn_implementation is None else {
            "attn_implementation": request.attn_implementation}

        def create():
            return auto.from_config(copy.deepcopy(config), **kwargs)

        try:
            model = build_as_user_code(create, redirect_devices=False)
        except ModelLoadError:
            raise
        except Exception as err:  # transformers raises what it likes
            text = " ".join(str(err).split())[:300]
            raise ModelLoadError(f"{target}: transformers {transformers.__version__} cannot build "
                                 f"{class_name(task, config.model_type)} from this config: "
                                 f"{type(err).__name__}: {text}") from None
        return _workload(target, model, config, task, batch, shapes, where, transformers.__version__)

    return target, build


def _override(config: Any, overrides: dict[str, Any], target: str) -> None:
    """``-O key=value`` sets an existing config field; a typo is refused, not added."""
    values = {}
    for key, value in overrides.items():  # each one's name and kind first, then the sizes
        if not hasattr(config, key):
            raise ModelOptionError(f"-O {key}={shown(value)}: {type(config).__name__} of {target} "
                                   f"has no field {key!r} (see its config.json)")
        values[key] = config_value(getattr(config, key), value, f"-O {key}={shown(value)}")
    check_counts(values, target)
    for key, value in values.items():
        setattr(config, key, value)


def _max_positions(config: Any) -> int | None:
    for name in _POSITION_FIELDS:
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _input_plan(config: Any, task: str, seq_len: int | None, target: str) -> dict[str, Any]:
    """Which inputs the model gets and their sizes, checked before anything is built."""
    if getattr(config, "num_mel_bins", None) and getattr(config, "max_source_positions", None):
        decoder = seq_len or int(config.max_target_positions)
        _check_positions(decoder, int(config.max_target_positions), target, "decoder ")
        # WhisperEncoder: conv1 stride 1, conv2 stride 2 -> max_source_positions frames
        return {"kind": "speech", "frames": 2 * int(config.max_source_positions),
                "mels": int(config.num_mel_bins), "seq": decoder, "decoder_seq": decoder}
    image_size = getattr(config, "image_size", None)
    if task == "image-cls" or (isinstance(image_size, int) and not getattr(config, "vocab_size", None)):
        if seq_len is not None:
            raise UsageError(f"--seq {seq_len} is not used: {target} is an image model "
                             f"({image_size}x{image_size}; -O image_size=N changes it)")
        return {"kind": "image", "size": int(image_size or 224),
                "channels": int(getattr(config, "num_channels", 3))}
    limit = _max_positions(config)
    seq = seq_len or min(DEFAULT_SEQ, limit or DEFAULT_SEQ)
    _check_positions(seq, limit, target, "")
    kind = "seq2seq" if getattr(config, "is_encoder_decoder", False) else "text"
    return {"kind": kind, "seq": seq, "decoder_seq": seq}


def _check_positions(seq: int, limit: int | None, target: str, what: str) -> None:
    if limit is not None and seq > limit:
        raise ModelOptionError(f"--seq {seq} exceeds {target}'s {what}positions ({limit}); give "
                               f"--seq {limit} or less, or -O to change the config")


def _workload(target: str, model: torch.nn.Module, config: Any, task: str, batch: int,
              plan: dict[str, Any], where: str, version: str) -> Workload:
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    kind = plan["kind"]
    named: dict[str, torch.Tensor] = {}
    if kind == "speech":
        named[model.main_input_name] = torch.randn(batch, plan["mels"], plan["frames"])
    elif kind == "image":
        named[model.main_input_name] = torch.randn(batch, plan["channels"], plan["size"], plan["size"])
    else:
        named[model.main_input_name] = torch.randint(0, vocab, (batch, plan["seq"]))
    if kind in ("speech", "seq2seq"):
        named["decoder_input_ids"] = torch.randint(0, vocab, (batch, plan["decoder_seq"]))
    _UnpaddedMasks.attach(model)
    input_ids = named.get("input_ids")
    labels = labels_for(task, config, batch, plan.get("seq", 0), plan.get("decoder_seq", 0), input_ids)
    if labels is not None:
        model.register_forward_pre_hook(TrainingLabels(labels), with_kwargs=True)
    inputs = _positional(model, named, target)
    tokens = batch * plan["seq"] if kind in ("text", "seq2seq") else None
    info = {
        "source": "hf", "config_source": where, "task": task, "model_class": type(model).__name__,
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
        "transformers_version": version,
    }
    if "seq" in plan:
        info |= {"seq_len": plan["seq"], "vocab": vocab}
    return Workload(model, inputs, OutputLoss() if labels is not None else HiddenStateSum(),
                    samples=batch, tokens=tokens, name=target, info=info)


def _positional(model: torch.nn.Module, named: dict[str, torch.Tensor], target: str) -> tuple[Any, ...]:
    """``named`` as the positional arguments of ``model.forward`` (None between them): nnperf
    calls ``model(*inputs)``."""
    left = dict(named)
    out: list[Any] = []
    for param in inspect.signature(model.forward).parameters.values():
        if not left:
            break
        if param.kind not in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
            break
        out.append(left.pop(param.name, None))
    if left:
        raise ModelLoadError(f"{target}: {type(model).__name__}.forward takes no positional "
                             f"{', '.join(left)}; write a factory that calls it")
    return tuple(out)


class _UnpaddedMasks:
    """While the model runs, transformers' test "does this padding mask pad anything?" answers
    no for a fake mask, as it answers on the real, unpadded batch nnperf describes.

    Some models make an all-ones padding mask when given none (BART's and Whisper's decoders);
    on real tensors transformers sees that nothing is padded (``fast_all``) and lets SDPA run
    with ``is_causal`` (flash attention on a GPU), but it cannot read a fake tensor's values
    and passes an explicit mask instead, a different kernel with every (query, key) pair. The
    inputs nnperf builds have no padding, so the answer is known. Hooks on the root module
    install the answer for the forward only (``always_call``: also when it raises); real
    tensors are asked as before."""

    _FUNCTIONS = ("_ignore_causal_mask_sdpa", "_ignore_bidirectional_mask_sdpa")

    def __init__(self) -> None:
        self.saved: dict[str, Any] = {}

    @classmethod
    def attach(cls, model: torch.nn.Module) -> None:
        try:
            from transformers import masking_utils
        except ImportError:  # transformers < 4.53 builds masks elsewhere
            return
        hooks = cls()
        model.register_forward_pre_hook(lambda *_: hooks.install(masking_utils))
        model.register_forward_hook(lambda *_: hooks.restore(masking_utils), always_call=True)

    def install(self, masking_utils: Any) -> None:
        from torch._subclasses.fake_tensor import FakeTensor

        for name in self._FUNCTIONS:
            original = getattr(masking_utils, name, None)
            if original is None or name in self.saved:
                continue
            self.saved[name] = original

            def unpadded(padding_mask, *args, _original=original, **kwargs):
                if isinstance(padding_mask, FakeTensor):
                    padding_mask = None
                return _original(padding_mask, *args, **kwargs)

            setattr(masking_utils, name, unpadded)

    def restore(self, masking_utils: Any) -> None:
        for name, original in self.saved.items():
            setattr(masking_utils, name, original)
        self.saved.clear()
