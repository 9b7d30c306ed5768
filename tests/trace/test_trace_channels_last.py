"""--channels-last: the step runs as model.to(memory_format=torch.channels_last) does, on fake
tensors as on real ones, and PyTorch keeps the activations NHWC through the network."""

from __future__ import annotations

import json

import torch
from click.testing import CliRunner
from torch import nn

from nnperf.analysis import analyze
from nnperf.cli.app import cli
from nnperf.trace.rebind import rebind_tensors


def _nhwc(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """What torch.Tensor.is_contiguous(memory_format=torch.channels_last) checks."""
    return torch.empty_strided(shape, stride, device="meta").is_contiguous(memory_format=torch.channels_last)


def test_weights_inputs_and_activations_are_nhwc():
    a = analyze("resnet18", batch=2, image_size=64, train=True, optimizer="none", channels_last=True)
    convs = [e for e in a.trace.events if e.name == "aten.convolution"]
    assert len(convs) == 20
    for e in convs:
        x, w, y = e.args[0], e.args[1], e.outputs[0]
        assert _nhwc(x.shape, x.stride) and _nhwc(w.shape, w.stride) and _nhwc(y.shape, y.stride), e.module
    plain = analyze("resnet18", batch=2, image_size=64, train=True, optimizer="none")
    x = next(e for e in plain.trace.events if e.name == "aten.convolution").args[0]
    assert x.stride == (3 * 64 * 64, 64 * 64, 64, 1)  # NCHW by default


def test_rebind_matches_module_to_on_real_tensors():
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Linear(4, 4))
    ref = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Linear(4, 4))
    ref.load_state_dict(model.state_dict())
    ref.to(memory_format=torch.channels_last)
    rebind_tensors(model, memory_format=torch.channels_last)
    for (name, t), (_, r) in zip(model.state_dict().items(), ref.state_dict().items(), strict=True):
        assert t.stride() == r.stride() and torch.equal(t, r), name


def test_predict_channels_last_option():
    def step_s(*extra: str) -> float:
        r = CliRunner().invoke(cli, ["predict", "resnet18", "--batch", "32", "--amp", "fp16", "--gpu", "a100",
                                     "--json", *extra])
        assert r.exit_code == 0, r.output
        doc = json.loads(r.output)
        return doc["totals"]["step_time_s"], doc["config"]

    nchw, _ = step_s()
    nhwc, config = step_s("--channels-last")
    assert nhwc < nchw  # no layout transposes around the tensor-core convolutions
    assert config["channels_last"] is True


def test_a_model_without_4d_tensors_refuses_the_option():
    """Nothing of a transformer is 4-D: the option would change nothing, so it is refused in one
    line instead of being dropped silently."""
    result = CliRunner().invoke(cli, ["predict", "gpt2", "-O", "n_layer=1", "--channels-last"])
    assert result.exit_code == 2
    assert "--channels-last changes nothing here: the model has no 4-D weight or image input" in result.output
