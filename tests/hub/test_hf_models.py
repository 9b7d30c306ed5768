"""``hf:`` models traced by nnperf against transformers' own count, for 13 architectures on
small configs written in this file (2 layers, hidden 32): parameters equal to the model
transformers builds from the same config; matrix FLOPs (GEMM, convolution, attention) of a
training step equal to ``FlopCounterMode`` over transformers' model called the way a training
loop calls it (``model(**inputs, labels=labels).loss.backward()``), corrected as
``flop_reference`` explains (the MoE experts' ``aten._grouped_mm`` counted by hand); every op
covered."""

from __future__ import annotations

import copy

import pytest
import torch
from flop_reference import nnperf_matrix_flops, training_step, uncovered_ops

transformers = pytest.importorskip("transformers")

from nnperf.analysis import analyze  # noqa: E402
from nnperf.trace.capture import trace_workload  # noqa: E402

B, T = 2, 16  # batch and sequence length of every text step
V = 97  # vocabulary: small and prime, so no dimension coincides with another

SMALL = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64,
             vocab_size=V)
CONFIGS = {
    "gpt2": lambda: transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=V, n_positions=64),
    "bert": lambda: transformers.BertConfig(**SMALL, max_position_embeddings=64),
    "roberta": lambda: transformers.RobertaConfig(**SMALL, max_position_embeddings=66, pad_token_id=1),
    "t5": lambda: transformers.T5Config(num_layers=2, d_model=32, d_kv=8, d_ff=64, num_heads=4,
                                        vocab_size=V, decoder_start_token_id=0),
    "bart": lambda: transformers.BartConfig(
        encoder_layers=2, decoder_layers=2, d_model=32, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=V,
        max_position_embeddings=64),
    "llama": lambda: transformers.LlamaConfig(**SMALL, num_key_value_heads=2),
    "mistral": lambda: transformers.MistralConfig(**SMALL, num_key_value_heads=2),
    "qwen2": lambda: transformers.Qwen2Config(**SMALL, num_key_value_heads=2),
    "gemma": lambda: transformers.GemmaConfig(**SMALL, num_key_value_heads=1, head_dim=8),
    "phi": lambda: transformers.PhiConfig(**SMALL, partial_rotary_factor=0.5),
    "vit": lambda: transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=32,
                                          num_hidden_layers=2, num_attention_heads=4,
                                          intermediate_size=64, num_labels=10),
    "whisper": lambda: transformers.WhisperConfig(
        d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=16,
        max_source_positions=16, max_target_positions=32, vocab_size=V, pad_token_id=0,
        bos_token_id=1, eos_token_id=2, decoder_start_token_id=3),
    # transformers 5 runs the experts as aten._grouped_mm, which PyTorch's CPU kernel takes in
    # bf16 only: the config's dtype, as Mixtral's own config.json gives it
    "mixtral": lambda: transformers.MixtralConfig(**SMALL, num_key_value_heads=2, num_local_experts=4,
                                                  num_experts_per_tok=2, dtype="bfloat16"),
}
#: architecture -> (task nnperf picks from the config's model type, Auto class, inputs kind)
EXPECTED_TASK = {
    "gpt2": "causal-lm", "bert": "masked-lm", "roberta": "masked-lm", "t5": "seq2seq-lm",
    "bart": "seq2seq-lm", "llama": "causal-lm", "mistral": "causal-lm", "qwen2": "causal-lm",
    "gemma": "causal-lm", "phi": "causal-lm", "vit": "image-cls", "whisper": "speech-seq2seq",
    "mixtral": "causal-lm",
}
AUTO = {
    "causal-lm": "AutoModelForCausalLM", "masked-lm": "AutoModelForMaskedLM",
    "seq2seq-lm": "AutoModelForSeq2SeqLM", "speech-seq2seq": "AutoModelForSpeechSeq2Seq",
    "image-cls": "AutoModelForImageClassification",
}


@pytest.fixture(scope="module")
def config_files(tmp_path_factory):
    """Each small config written as a config.json, given to nnperf as hf:PATH."""
    folder = tmp_path_factory.mktemp("hf_configs")
    paths = {}
    for name, make in CONFIGS.items():
        paths[name] = folder / f"{name}.json"
        make().to_json_file(paths[name])
    return paths


def _inputs_and_labels(arch: str, config) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """What a training loop feeds each model, written out independently of nnperf."""
    if arch == "vit":
        return {"pixel_values": torch.randn(B, 3, 32, 32)}, torch.randint(0, 10, (B,))
    if arch == "whisper":  # the encoder takes exactly 2 * max_source_positions frames
        dec = torch.randint(0, V, (B, config.max_target_positions))
        return ({"input_features": torch.randn(B, 16, 32), "decoder_input_ids": dec},
                torch.randint(0, V, (B, config.max_target_positions)))
    ids = torch.randint(0, V, (B, T))
    if arch in ("t5", "bart"):
        return {"input_ids": ids, "decoder_input_ids": torch.randint(0, V, (B, T))}, torch.randint(0, V, (B, T))
    if EXPECTED_TASK[arch] == "masked-lm":
        return {"input_ids": ids}, torch.randint(0, V, (B, T))
    return {"input_ids": ids}, ids  # causal LM: the labels are the inputs, shifted inside


def _reference(arch: str, attn: str):
    """transformers' model on real tensors (the configs are small enough to run)."""
    torch.manual_seed(0)
    config = CONFIGS[arch]()
    auto = getattr(transformers, AUTO[EXPECTED_TASK[arch]])
    model = auto.from_config(copy.deepcopy(config), attn_implementation=attn)
    inputs, labels = _inputs_and_labels(arch, config)
    return training_step(model, lambda m: m(**inputs, labels=labels).loss), type(model).__name__


def _nnperf(path, arch: str, attn: str, **kw):
    seq = None if arch in ("vit", "whisper") else T
    return analyze(f"hf:{path}", batch=B, seq_len=seq, attn_implementation=attn, optimizer="sgd", **kw)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("arch", list(CONFIGS))
def test_parameters_and_matrix_flops_equal_transformers_own(config_files, arch, attn):
    a = _nnperf(config_files[arch], arch, attn)
    ref, model_class = _reference(arch, attn)
    assert a.config["task"] == EXPECTED_TASK[arch]
    assert a.config["model_class"] == model_class
    assert a.config["attn_implementation"] == attn
    assert a.totals["params"] == ref.params
    if arch == "mixtral":  # transformers 5: the experts as grouped GEMMs, 70% of the FLOPs here
        assert ref.grouped_mm_calls > 0 and ref.grouped_mm_flops > ref.expected() / 2
    assert nnperf_matrix_flops(a) == ref.expected()
    if attn == "sdpa":
        assert ref.sdpa_calls > 0  # routed to nnperf::attention
    if EXPECTED_TASK[arch] == "causal-lm" and attn == "sdpa":
        assert ref.causal_calls > 0  # the correction was exercised
    assert uncovered_ops(a) == set() and a.coverage["op_share"] == 1.0


def test_the_loss_is_the_models_own(config_files):
    """nnperf's training step returns the loss transformers computes from the labels: on real
    tensors (``real=True``) the traced step's loss equals ``model(ids, labels=ids).loss``."""
    from nnperf.hub import HubRequest
    from nnperf.hub.huggingface import builder

    torch.manual_seed(0)
    _, build = builder(HubRequest(str(config_files["llama"]), batch=B, seq_len=T, overrides={}))
    wl = build()
    wl.model.train()
    ids = wl.inputs[0]
    loss = wl.loss_fn(wl.model(*wl.inputs))
    direct = wl.model(input_ids=ids, labels=ids).loss
    assert torch.allclose(loss, direct)
    with torch.no_grad():  # inference: the bare forward, no labels, no loss
        assert wl.model(*wl.inputs).loss is None


def test_inference_runs_no_loss(config_files):
    train = _nnperf(config_files["gpt2"], "gpt2", "sdpa")
    infer = _nnperf(config_files["gpt2"], "gpt2", "sdpa", train=False)
    ops = {op.op for op in infer.ops}
    assert not any("nll_loss" in name or "log_softmax" in name for name in ops)
    assert any("nll_loss" in op.op for op in train.ops)


@pytest.mark.parametrize("arch", list(CONFIGS))
def test_the_trace_on_meta_tensors_is_the_one_on_fakes(config_files, arch):
    """Every architecture records on meta tensors (``trace.meta_world``) the step it records on
    fakes, op for op, but two that need the fakes' values: Mixtral's routing, and BART's
    padding mask, whose values transformers reads unless it sees a fake tensor
    (``masking_utils._ignore_causal_mask_sdpa``)."""
    from nnperf.hub import HubRequest
    from nnperf.hub.huggingface import builder
    from nnperf.trace.options import TraceOptions

    seq = None if arch in ("vit", "whisper") else T
    _, build = builder(HubRequest(str(config_files[arch]), batch=B, seq_len=seq, overrides={}))
    options = TraceOptions(amp="bf16")
    meta, _ = trace_workload(build, options)
    fake, _ = trace_workload(build, options, meta_first=False)
    assert (meta.config.pop("tensors"), fake.config.pop("tensors")) == \
        ("fake" if arch in ("mixtral", "bart") else "meta", "fake")
    assert [(e.name, e.args, e.kwargs, e.inputs, e.outputs, e.phase, e.module, e.free, e.allocates)
            for e in meta.events] == \
        [(e.name, e.args, e.kwargs, e.inputs, e.outputs, e.phase, e.module, e.free, e.allocates)
         for e in fake.events]
    assert {k: repr(v) for k, v in meta.storages.items()} == {k: repr(v) for k, v in fake.storages.items()}


def test_flex_attention_is_traced_as_transformers_calls_it(config_files):
    """``attn_implementation="flex_attention"``: transformers' compiled flex_attention with its
    causal BlockMask, one op each way; the pairs it keeps are causal SDPA's, and its one
    16-token block (of 128 x 128) computes every pair: B x 4 heads x 16 x 16."""
    flex = _nnperf(config_files["llama"], "llama", "flex_attention")
    sdpa = _nnperf(config_files["llama"], "llama", "sdpa")
    assert flex.config["attn_implementation"] == "flex_attention"
    fwd = [o for o in flex.ops if o.op == "higher_order.flex_attention"]
    ref = [o for o in sdpa.ops if o.op == "nnperf.attention"]
    assert len(fwd) == len(ref) == SMALL["num_hidden_layers"]
    assert [o.flops for o in fwd] == [o.flops for o in ref]
    assert all(o.info["kept_pairs"] == B * 4 * T * (T + 1) // 2 for o in fwd)
    assert all(o.info["executed_pairs"] == B * 4 * T * T for o in fwd)
    assert not flex.trace.config.get("assumptions")
