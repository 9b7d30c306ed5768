"""Full-size zoo models against published parameter counts, built on fake tensors.

The expected numbers are the figures published for the reference implementations
(torchvision, Hugging Face, Meta); they are kept literal so a regression cannot move both
the model and the expectation at once.
"""

from __future__ import annotations

import pytest
from torch._subclasses.fake_tensor import FakeTensorMode

from nnperf.zoo import get_model, list_models

PUBLISHED = {
    "alexnet": 61_100_840,
    "alexnet-caffe": 60_965_224,
    "vgg16": 138_357_544,
    "resnet18": 11_689_512,
    "resnet50": 25_557_032,
    "mobilenet_v2": 3_504_872,
    "vit_b_16": 86_567_656,
    "gpt2": 124_439_808,
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200,
    "llama-7b": 6_738_415_616,
    # Mixtral 8x7B's config.json: 32 layers of d 4096, GQA with 8 KV heads, 8 experts of SwiGLU
    # 14336, vocab 32000, untied head; "Mixtral of Experts" (Jiang et al. 2024) rounds it to 46.7B
    "mixtral-8x7b": 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 8 * 3 * 4096 * 14336 + 4096 * 8 + 2 * 4096)
    + 2 * 32000 * 4096 + 4096,
    # torchtitan's DeepSeek-V3 "16B" flavor: 27 blocks of d 2048 with latent attention (16 heads:
    # q 2048 -> 16 x 192; kv 2048 -> 512 + 64, norm 512, 512 -> 16 x (128 + 128); out 16 x 128 ->
    # 2048), one dense SwiGLU 10944 then 26 MoE blocks (router 2048 x 64, 64 experts of SwiGLU
    # 1408, shared SwiGLU 2 x 1408), vocab 102400, untied head; torchtitan logs 15.71B (2.66B active)
    "deepseek-v3-16b": 27 * (2048 * 16 * 192 + 2048 * 576 + 512 + 512 * 16 * 256 + 16 * 128 * 2048 + 2 * 2048)
    + 3 * 2048 * 10944 + 26 * (2048 * 64 + 64 * 3 * 2048 * 1408 + 3 * 2048 * 2816)
    + 2 * 102400 * 2048 + 2048,
    # DeepSeek-V3 (its config.json): 61 blocks of d 7168 with latent attention (128 heads: q 7168
    # -> 1536, norm 1536, 1536 -> 128 x 192; kv 7168 -> 512 + 64, norm 512, 512 -> 128 x 256; out
    # 128 x 128 -> 7168), 3 dense SwiGLU 18432 then 58 MoE blocks (router 7168 x 256, 256 experts
    # of SwiGLU 2048, one shared of 2048), vocab 129280, untied head; the technical report's 671B
    # (its multi-token-prediction module apart)
    "deepseek-v3": 61 * (7168 * 1536 + 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 + 512 * 128 * 256
                         + 128 * 128 * 7168 + 2 * 7168)
    + 3 * 3 * 7168 * 18432 + 58 * (7168 * 256 + 257 * 3 * 7168 * 2048) + 2 * 129280 * 7168 + 7168,
    # Llama 2 and 3 as Hugging Face publishes them (model.safetensors.index.json "total_size" over
    # 2 bytes): meta-llama/Llama-2-70b-hf, Meta-Llama-3-8B, Meta-Llama-3-70B, Llama-3.1-405B
    "llama2-70b": 68_976_648_192,
    "llama3-8b": 8_030_261_248,
    "llama3-70b": 70_553_706_496,
    "llama3.1-405b": 405_853_388_800,
    # Megatron's count of a GPT block, 12 h^2 + 13 h (the BLOOM README's and Narayanan et al.'s),
    # the token and position embeddings and the final LayerNorm: GPT-3 175B (96 x 12288, vocab
    # padded to 51200, 2048 positions; Brown et al. 2020 round it to 175.0B) and MT-NLG 530B
    # (105 x 20480)
    "gpt3-175b": 96 * (12 * 12288**2 + 13 * 12288) + 51200 * 12288 + 2048 * 12288 + 2 * 12288,
    "mt-nlg-530b": 105 * (12 * 20480**2 + 13 * 20480) + 51200 * 20480 + 2048 * 20480 + 2 * 20480,
    # BLOOM: 176,247,271,424 (bigscience/bloom's published total), plus the 2048 x 14336 learned
    # positions standing in for ALiBi, less the embedding's LayerNorm (2 x 14336) it leaves out
    "bloom-176b": 176_247_271_424 + 2048 * 14336 - 2 * 14336,
    # Nemotron-4 340B (Parmar et al. 2024, Table 1): 96 blocks of 18432 with 96 heads of 192 and 8
    # key/value heads, squared-ReLU MLP of 73728 (two matrices), two LayerNorms with bias; untied
    # 256000-token embedding and output; the report's 340B
    "nemotron4-340b": 96 * (2 * 18432 * 18432 + 2 * 18432 * 8 * 192 + 2 * 18432 * 73728 + 4 * 18432)
    + 2 * 256000 * 18432 + 2 * 18432,
}


def count(module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_parameter_count(name: str) -> None:
    with FakeTensorMode():
        workload = get_model(name).build(1)
    assert count(workload.model) == PUBLISHED[name]


def test_bert_base_model_and_pretraining_heads() -> None:
    with FakeTensorMode():
        model = get_model("bert-base").build(1).model
    assert count(model.bert) == 109_482_240  # encoder + pooler, the published BERT-base
    # Heads: MLM transform dense (768*768 + 768) and LayerNorm (2*768), decoder bias (30522,
    # the decoder weight is tied to the word embeddings) and NSP (768*2 + 2).
    heads = 768 * 768 + 768 + 2 * 768 + 30522 + 768 * 2 + 2
    assert count(model) == 109_482_240 + heads == 110_106_428
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight


def test_gpt2_lm_head_is_tied() -> None:
    with FakeTensorMode():
        model = get_model("gpt2").build(1, 8).model
    assert model.lm_head.weight is model.wte.weight


def test_nemotron_4_15b_block_shape() -> None:
    """llama-7b with Nemotron-4 15B's block (Parmar et al. 2024, Nemotron-4 15B Technical Report,
    Table 1 and section 2: 32 blocks of 6144, 48 heads with 8 key/value heads, squared-ReLU MLP of
    4 x 6144, LayerNorm, no bias, untied 256000-token embeddings): per block the four attention
    projections, two MLP matrices (no gate) and two LayerNorms with their bias, 12.5B in all (the
    report's non-embedding count); its embedding and output projection 256000 x 6144 each."""
    options = {"n_layer": 32, "dim": 6144, "n_heads": 48, "n_kv_heads": 8, "ffn_hidden": 24576,
               "vocab": 256000, "mlp": "squared-relu", "norm": "layernorm"}
    with FakeTensorMode():
        model = get_model("llama-7b").build(1, 8, **options).model
    kv = 8 * 6144 // 48
    block = 2 * 6144 * 6144 + 2 * 6144 * kv + 2 * 6144 * 24576 + 2 * 2 * 6144
    assert count(model.layers) == 32 * block
    assert round(count(model.layers) / 1e9, 1) == 12.5
    assert count(model) == 32 * block + 2 * 256000 * 6144 + 2 * 6144  # the final LayerNorm's too
    assert not hasattr(model.layers[0].feed_forward, "w3")


def test_qwen3_30b_a3b_shape_with_its_own_head_size() -> None:
    """llama-7b with Qwen3-30B-A3B's shape (its config.json: 48 blocks of 2048, 32 query heads and
    4 key/value heads of head_dim 128, so q is 2048 -> 4096 wide, not the hidden size; 128 experts
    of SwiGLU 768, top-8; vocabulary 151936, untied; q_norm and k_norm, an RMSNorm weight of
    head_dim each a block): 30.5B parameters as Qwen reports."""
    options = {"n_layer": 48, "dim": 2048, "n_heads": 32, "n_kv_heads": 4, "head_dim": 128, "ffn_hidden": 6144,
               "vocab": 151936, "n_experts": 128, "top_k": 8, "moe_hidden": 768, "qk_norm": True}
    with FakeTensorMode():
        model = get_model("llama-7b").build(1, 8, **options).model
    attention = model.layers[0].attention
    assert (attention.wq.weight.shape, attention.wk.weight.shape, attention.wo.weight.shape) == (
        (32 * 128, 2048), (4 * 128, 2048), (2048, 32 * 128))
    assert attention.q_norm.weight.shape == attention.k_norm.weight.shape == (128,)
    block = 2048 * 4096 * 2 + 2048 * 512 * 2 + 2048 * 128 + 128 * 3 * 2048 * 768 + 2 * 2048 + 2 * 128
    assert count(model) == 48 * block + 2 * 151936 * 2048 + 2048
    assert round(count(model) / 1e9, 1) == 30.5


def test_mlp_and_mnist_counts_from_layer_shapes() -> None:
    with FakeTensorMode():
        mlp = get_model("mlp").build(1).model
        mnist = get_model("mnist-cnn").build(1).model
    assert count(mlp) == (784 * 1024 + 1024) + (1024 * 1024 + 1024) + (1024 * 10 + 10)
    conv = (1 * 32 * 9 + 32) + (32 * 64 * 9 + 64)
    assert count(mnist) == conv + (9216 * 128 + 128) + (128 * 10 + 10)


@pytest.mark.parametrize("spec", list_models(), ids=lambda s: s.name)
def test_full_size_default_step_on_fake_tensors(spec) -> None:
    """Default batch and sequence, forward + loss + backward, with no real memory.

    Proves the forward has no data-dependent operations at the sizes users will trace.
    """
    with FakeTensorMode():
        w = spec.build(spec.default_batch)
        loss = w.loss_fn(w.model(*w.inputs))
        assert loss.dim() == 0
        loss.backward()
    assert w.samples == spec.default_batch
    if spec.default_seq is None:
        assert w.tokens is None
    else:
        assert w.tokens == spec.default_batch * spec.default_seq
        assert tuple(w.inputs[0].shape) == (spec.default_batch, spec.default_seq)
