"""The issue's failing factories, written as users write them: a transformers model cast with
``model.to(torch.bfloat16)`` (was "_apply(): Couldn't swap Embedding.weight"), moved to CUDA,
its attention implementation set; timm's ViT and ConvNeXt and torchvision's vit_b_16 built in
a factory (were "DataDependentOutputException: aten._local_scalar_dense")."""

from __future__ import annotations

import textwrap

import pytest
import torch

from nnperf.analysis import analyze

FACTORIES = textwrap.dedent('''
    import torch

    def llama(attn="sdpa"):
        import transformers
        config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, vocab_size=97)
        model = transformers.AutoModelForCausalLM.from_config(config)
        model.set_attn_implementation(attn)
        model = model.to(torch.bfloat16).to("cuda")
        ids = torch.randint(0, 97, (2, 16), device="cuda")
        return model, (ids,), lambda out: out.logits.float().sum()

    def llama_eager():
        return llama("eager")

    def timm_vit():
        import timm
        return timm.create_model("vit_base_patch16_224", depth=2), (torch.randn(2, 3, 224, 224),)

    def timm_convnext():
        import timm
        return timm.create_model("convnext_tiny"), (torch.randn(2, 3, 224, 224),)

    def tv_vit():
        import torchvision
        return torchvision.models.vit_b_16(), (torch.randn(2, 3, 224, 224),)
''')


@pytest.fixture(scope="module")
def factories(tmp_path_factory):
    path = tmp_path_factory.mktemp("library_factories") / "facs.py"
    path.write_text(FACTORIES)
    return str(path)


def test_a_transformers_model_cast_moved_and_with_its_attention_set(factories):
    transformers = pytest.importorskip("transformers")
    sdpa, eager = analyze(f"{factories}:llama"), analyze(f"{factories}:llama_eager")
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=97)
    with torch.device("meta"):
        params = sum(p.numel() for p in transformers.LlamaForCausalLM(config).parameters())
    for a in (sdpa, eager):
        assert a.config["dtype"] == "bf16"
        assert a.totals["params"] == params
        assert a.totals["param_bytes"] == 2 * params
    assert any(op.category == "attention" for op in sdpa.ops)  # fused SDPA
    assert not any(op.category == "attention" for op in eager.ops)  # matmuls and a softmax


@pytest.mark.parametrize("name", ["timm_vit", "timm_convnext", "tv_vit"])
def test_vision_models_that_read_values_while_building(factories, name):
    pytest.importorskip("timm")
    a = analyze(f"{factories}:{name}")
    import timm
    import torchvision

    expected = {
        "timm_vit": lambda: timm.create_model("vit_base_patch16_224", depth=2),
        "timm_convnext": lambda: timm.create_model("convnext_tiny"),
        "tv_vit": lambda: torchvision.models.vit_b_16(),
    }[name]()
    assert a.totals["params"] == sum(p.numel() for p in expected.parameters())
