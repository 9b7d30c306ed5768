"""``tv:NAME``: a torchvision classification model (``torchvision.models.get_model(NAME,
weights=None)``) at its default input size: its own ``image_size`` where the architecture
fixes one (the ViTs check it), else the crop size of its default weights' transforms (299
for inception_v3, 224 for most), as torchvision's reference scripts feed it; cross entropy
against random labels. ``-O key=value`` goes to ``get_model`` (``-O num_classes=10``)."""

from __future__ import annotations

from collections.abc import Callable

from nnperf.errors import ModelLoadError, shown
from nnperf.hub import HubRequest
from nnperf.hub.common import image_workload, refuse_seq, require, unknown_name
from nnperf.trace.construction import build_as_user_code
from nnperf.workload import Workload

#: A training batch when --batch is not given (torchvision's classification reference: 32).
DEFAULT_BATCH = 32


def builder(request: HubRequest) -> tuple[str, Callable[[], Workload]]:
    target = f"tv:{request.name}"
    torchvision = require("torchvision", target)
    refuse_seq(target, request.seq_len)
    models = torchvision.models
    classification = models.list_models(module=models)
    if request.name not in classification:
        others = set(models.list_models()) - set(classification)
        if request.name in others:
            raise ModelLoadError(f"{target} is not a classification model; tv: builds "
                                 "torchvision.models classifiers (write a factory for the others)")
        raise unknown_name("torchvision model", request.name, classification,
                           "torchvision.models.list_models(module=torchvision.models)")
    batch = request.batch or DEFAULT_BATCH

    def build() -> Workload:
        def create():
            return models.get_model(request.name, weights=None, **request.overrides)

        try:  # nn.init.trunc_normal_ reads values (torch 2.14): meta parameters
            model = build_as_user_code(create, meta_first=True, redirect_devices=False)
        except (TypeError, ValueError, RuntimeError) as err:
            if isinstance(err, RuntimeError) and not request.overrides:
                raise  # not a value the user gave: a bug to report, with its traceback
            # a RuntimeError with -O values: torch refusing one (num_classes=-5: a negative size)
            given = " ".join(f"-O {k}={shown(v)}" for k, v in request.overrides.items())
            raise ModelLoadError(f"{target}: torchvision refused {given or 'the model'}: {err}") from None
        size = _image_size(models, request.name, model)
        classes = int(request.overrides.get("num_classes", 1000))
        return image_workload(target, model, batch, (3, size, size), classes,
                              {"source": "torchvision", "torchvision_version": torchvision.__version__})

    return target, build


def _image_size(models, name: str, model) -> int:
    """The model's fixed ``image_size``, else its default weights' crop, else 224."""
    fixed = getattr(model, "image_size", None)
    if isinstance(fixed, int):
        return fixed
    try:
        crop = models.get_model_weights(name).DEFAULT.transforms().crop_size
        return int(crop[0])
    except (AttributeError, KeyError, ValueError, IndexError, TypeError):
        return 224
