"""Model lookup, specs and the errors users see for bad names, sizes and options."""

from __future__ import annotations

import pytest
from torch._subclasses.fake_tensor import FakeTensorMode

from nnperf.errors import ModelLoadError, UsageError
from nnperf.zoo import MODELS, ModelSpec, get_model, list_models

EXPECTED_BATCH = {
    "mlp": 64, "mnist-cnn": 64, "alexnet": 128, "alexnet-caffe": 128, "vgg16": 64,
    "resnet18": 64, "resnet50": 64, "mobilenet_v2": 64, "efficientnet_b0": 64,
    "efficientnet_b4": 64, "efficientnet_widese_b0": 64, "efficientnet_widese_b4": 64,
    "convnext_tiny": 64, "vit_b_16": 64, "bert-base": 32, "bert-large": 32, "bert-large-squad": 32,
    "gpt2": 8, "gpt2-medium": 8, "gpt2-large": 8, "gpt2-xl": 8, "gpt3-175b": 1, "mt-nlg-530b": 1,
    "bloom-176b": 1, "llama-7b": 1, "llama2-70b": 1, "llama3-8b": 1, "llama3-70b": 1, "llama3.1-405b": 1,
    "nemotron4-340b": 1, "mixtral-8x7b": 1, "deepseek-v3-16b": 1, "deepseek-v3": 1,
}  # fmt: skip
EXPECTED_SEQ = {"bert-base": 128, "bert-large": 128, "bert-large-squad": 384, "gpt2": 1024,
                "gpt2-medium": 1024, "gpt2-large": 1024, "gpt2-xl": 1024, "gpt3-175b": 2048, "mt-nlg-530b": 2048,
                "bloom-176b": 2048, "llama-7b": 4096, "llama2-70b": 4096, "llama3-8b": 8192, "llama3-70b": 8192,
                "llama3.1-405b": 8192, "nemotron4-340b": 4096, "mixtral-8x7b": 4096,
                "deepseek-v3-16b": 4096, "deepseek-v3": 4096}  # fmt: skip


def test_names_and_defaults() -> None:
    assert list(MODELS) == list(EXPECTED_BATCH)
    assert [s.name for s in list_models()] == list(MODELS)
    for spec in list_models():
        assert isinstance(spec, ModelSpec)
        assert spec.default_batch == EXPECTED_BATCH[spec.name]
        assert spec.default_seq == EXPECTED_SEQ.get(spec.name)
        assert spec.family in {"mlp", "cnn", "vision-transformer", "encoder", "decoder"}
        assert spec.summary and "\n" not in spec.summary and spec.input_desc


@pytest.mark.parametrize(
    ("typed", "name"),
    [("ResNet-50", "resnet50"), ("MOBILENET-V2", "mobilenet_v2"), ("vit-b-16", "vit_b_16"),
     ("gpt2_medium", "gpt2-medium"), ("Llama_7B", "llama-7b"), ("alexnet_caffe", "alexnet-caffe"),
     ("mnist_cnn", "mnist-cnn"), ("llama7b", "llama-7b"), (" GPT2-XL ", "gpt2-xl"),
     ("Llama3.1-405B", "llama3.1-405b"), ("GPT3_175B", "gpt3-175b")],
)  # fmt: skip
def test_get_model_is_case_and_dash_blind(typed: str, name: str) -> None:
    assert get_model(typed) is MODELS[name]


@pytest.mark.parametrize(
    ("typed", "suggestion"),
    [("resnet5", "resnet50"), ("gpt2-mdium", "gpt2-medium"), ("mobilenet", "mobilenet_v2"),
     ("lama-7b", "llama-7b"), ("vgg", "vgg16")],
)  # fmt: skip
def test_unknown_name_suggests_closest(typed: str, suggestion: str) -> None:
    with pytest.raises(ModelLoadError, match="did you mean") as err:
        get_model(typed)
    assert suggestion in str(err.value) and repr(typed) in str(err.value)


def test_hopeless_name_lists_all_models() -> None:
    with pytest.raises(ModelLoadError, match="known models") as err:
        get_model("xyzzy-frobnicator")
    assert all(name in str(err.value) for name in MODELS)


@pytest.mark.parametrize("spec", list_models(), ids=lambda s: s.name)
def test_unknown_override_names_key_and_valid_ones(spec: ModelSpec) -> None:
    with pytest.raises(UsageError) as err:
        spec.build(1, bogus_key=3)
    message = str(err.value)
    assert "bogus_key" in message and spec.name in message
    assert all(option in message for option in spec.options)


def test_misspelt_option() -> None:
    with pytest.raises(UsageError, match=r"'n_layers'.*n_layer"):
        get_model("gpt2").build(1, 8, n_layers=2)


@pytest.mark.parametrize("spec", list_models(), ids=lambda s: s.name)
def test_bad_batch_and_seq(spec: ModelSpec) -> None:
    with pytest.raises(UsageError, match="batch"):
        spec.build(0)
    with pytest.raises(UsageError, match=r"seq_len|sequence"):
        spec.build(1, 0)


def test_sequence_length_limits_and_defaults() -> None:
    with pytest.raises(UsageError, match="n_positions"):
        get_model("gpt2").build(1, 2048)
    with pytest.raises(UsageError, match="max_positions"):
        get_model("bert-base").build(1, 513)
    with pytest.raises(UsageError, match="no sequence length"):
        get_model("resnet50").build(1, 128)
    with FakeTensorMode():
        w = get_model("gpt2").build(None, n_layer=1)
    assert tuple(w.inputs[0].shape) == (8, 1024)
    assert w.info["seq_len"] == 1024 and w.tokens == 8 * 1024


def test_string_overrides_are_converted() -> None:
    """Overrides arriving as command-line strings become numbers."""
    with FakeTensorMode():
        w = get_model("llama-7b").build(2, 16, n_layer="2", dim="64", n_heads="4", vocab="99")
    assert len(w.model.layers) == 2 and w.model.output.out_features == 99
    assert w.info["config"]["n_kv_heads"] == 4
    with pytest.raises(UsageError, match="n_layer must be an integer"):
        get_model("gpt2").build(1, 8, n_layer="two")


def test_invalid_shapes() -> None:
    with pytest.raises(UsageError, match="n_heads"):
        get_model("llama-7b").build(1, 8, n_heads=32, n_kv_heads=5)
    with pytest.raises(UsageError, match="n_head"):
        get_model("gpt2").build(1, 8, n_embd=100, n_head=3)
    with pytest.raises(UsageError, match="patch_size"):
        get_model("vit_b_16").build(1, image_size=100)
    with pytest.raises(UsageError, match="image_size"):
        get_model("resnet18").build(1, image_size=8)
    with pytest.raises(UsageError, match="widths"):
        get_model("mlp").build(1, widths="784,abc")
    with pytest.raises(UsageError, match="widths"):
        get_model("mlp").build(1, widths=[10])


def test_mlp_widths_and_info() -> None:
    with FakeTensorMode():
        a = get_model("mlp").build(3, widths=[8, 4, 2])
        b = get_model("mlp").build(3, widths="8,4,2")
    assert str(a.model) == str(b.model)
    assert tuple(a.inputs[0].shape) == (3, 8)
    assert a.info["config"]["widths"] == [8, 4, 2] and a.info["num_classes"] == 2


def test_image_info() -> None:
    with FakeTensorMode():
        w = get_model("resnet18").build(4, image_size=128, num_classes=7)
    assert tuple(w.inputs[0].shape) == (4, 3, 128, 128)
    assert w.info["image_size"] == 128 and w.info["num_classes"] == 7
    assert w.model.fc.out_features == 7 and w.name == "resnet18"


def test_presets_are_the_published_models_left_out_of_single_gpu_plans() -> None:
    from nnperf.zoo import PRESETS

    expected = {"gpt3-175b", "mt-nlg-530b", "bloom-176b", "llama2-70b", "llama3-8b", "llama3-70b", "llama3.1-405b",
                "nemotron4-340b", "deepseek-v3"}
    assert set(PRESETS) == expected
    assert [s.name for s in list_models(presets=False)] == [n for n in MODELS if n not in PRESETS]
