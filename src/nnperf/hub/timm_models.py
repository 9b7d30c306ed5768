"""``timm:NAME``: a timm model (``timm.create_model(NAME, pretrained=False)``) at timm's own
default input size (the model's ``pretrained_cfg['input_size']``, e.g. 3x224x224 for
convnext_tiny, 3x384x384 for vit_base_patch16_384), training with cross entropy against
random labels as timm's train.py does. ``-O key=value`` goes to ``create_model``
(``-O num_classes=10``, ``-O drop_path_rate=0.1``); a pretrained tag (``NAME.TAG``) picks that
tag's config (input size), never its weights."""

from __future__ import annotations

from collections.abc import Callable

from nnperf.errors import ModelLoadError, shown
from nnperf.hub import HubRequest
from nnperf.hub.common import image_workload, refuse_seq, require, unknown_name
from nnperf.trace.construction import build_as_user_code
from nnperf.workload import Workload

#: A training batch when --batch is not given (nnperf's zoo CNNs use 32..256; timm's
#: train.py defaults to 128).
DEFAULT_BATCH = 32


def builder(request: HubRequest) -> tuple[str, Callable[[], Workload]]:
    target = f"timm:{request.name}"
    timm = require("timm", target)
    refuse_seq(target, request.seq_len)
    if not timm.is_model(request.name):
        raise unknown_name("timm model", request.name, timm.list_models(), "timm.list_models()")
    batch = request.batch or DEFAULT_BATCH

    def build() -> Workload:
        def create():
            return timm.create_model(request.name, pretrained=False, **request.overrides)

        try:  # timm reads drop-path rates off a tensor while building: meta parameters
            model = build_as_user_code(create, meta_first=True, redirect_devices=False)
        except (TypeError, ValueError, RuntimeError) as err:
            # an -O keyword the constructor does not take, or a value torch refuses
            if not isinstance(err, TypeError) and not request.overrides:
                raise  # not a value the user gave: a bug to report, with its traceback
            raise ModelLoadError(f"{target}: timm.create_model refused {_given(request)}: "
                                 f"{err}") from None
        cfg = getattr(model, "pretrained_cfg", None) or {}
        input_size = tuple(int(s) for s in cfg.get("input_size", (3, 224, 224)))
        return image_workload(target, model, batch, input_size, int(getattr(model, "num_classes", 0)),
                              {"source": "timm", "timm_version": timm.__version__})

    return target, build


def _given(request: HubRequest) -> str:
    return " ".join(f"-O {k}={shown(v)}" for k, v in request.overrides.items()) or "the model"
