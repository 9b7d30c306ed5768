"""DeepSeek-V3's architecture at torchtitan's 16B size (``deepseek_v3`` flavor "16B", the
DeepSeek-MoE-16B shape with latent attention): the model torchtitan trains with expert
parallelism in its published MoE runs.

It is the zoo's Llama stack (``zoo.llama``: ``tok_embeddings``, ``layers``, ``norm``,
``output``, so FSDP, pipeline splits and expert parallelism apply as they do to Llama) with
DeepSeek's blocks: multi-head latent attention (``zoo.mla``), one dense SwiGLU block first and
mixture-of-experts blocks after it (64 routed experts of hidden 1408, 6 per token, and 2
experts' width of shared SwiGLU). The router is torchtitan's for this flavor: softmax scores,
chosen on the scores plus the load-balancing bias and not renormalized (torchtitan's
``route_norm=True`` applies to sigmoid scores only), applied to the experts' outputs
(``score_before_experts=False``). Configuration: ``torchtitan/models/deepseek_v3/__init__.py``
(commit f738a03, 2025-08-22): 15.71 B parameters, 2.66 B active per token.

Not as torchtitan runs it there: attention is causal SDPA over the whole sequence, where
torchtitan switched this flavor to FlexAttention with block-causal (document) masking in that
commit; SDPA's memory-efficient kernel is what its SDPA runs used (the flash kernel needs equal
q/k/v head sizes).
"""

from __future__ import annotations

from typing import Any

from nnperf.workload import Workload

from ._spec import ModelSpec, Preset
from .llama import ATTENTION_OPTIONS, _build

DEFAULTS: dict[str, Any] = {
    "n_layer": 27,
    "n_dense_layers": 1,
    "dim": 2048,
    "n_heads": 16,
    "q_lora": 0,
    "kv_lora": 512,
    "qk_nope_dim": 128,
    "qk_rope_dim": 64,
    "v_head_dim": 128,
    "ffn_hidden": 10944,
    "n_experts": 64,
    "top_k": 6,
    "moe_hidden": 1408,
    "n_shared_experts": 2,
    "vocab": 102400,
    "attention": "sdpa",
    "doc_len": 0,
}
#: The router of torchtitan's 16B flavor (module docstring): not options, the architecture.
ROUTER: dict[str, Any] = {"renormalize": False, "score_before_experts": False, "expert_bias": True}
OPTIONS = {
    "n_layer": "number of transformer blocks",
    "n_dense_layers": "leading blocks with a dense SwiGLU instead of experts",
    "dim": "hidden size",
    "n_heads": "attention heads",
    "q_lora": "query latent rank (0: queries projected directly)",
    "kv_lora": "key/value latent rank",
    "qk_nope_dim": "per-head query/key features without rotary embedding",
    "qk_rope_dim": "per-head query/key features with rotary embedding (one key shared by all heads)",
    "v_head_dim": "per-head value size",
    "ffn_hidden": "dense blocks' SwiGLU hidden size",
    "n_experts": "routed experts per mixture-of-experts block",
    "top_k": "experts each token is routed to",
    "moe_hidden": "each expert's SwiGLU hidden size (0: ffn_hidden)",
    "n_shared_experts": "shared experts (their SwiGLU is this many experts wide; 0: none)",
    "vocab": "vocabulary size",
    **ATTENTION_OPTIONS,
}


def build(batch: int | None = None, seq_len: int | None = None, **overrides: Any) -> Workload:
    """Token ids (batch, seq); next-token cross entropy over the vocabulary."""
    return _build("deepseek-v3-16b", DEFAULTS, batch, seq_len, overrides, fixed=ROUTER)


#: DeepSeek-V3 as published (deepseek-ai/DeepSeek-V3 config.json; DeepSeek-AI 2024, "DeepSeek-V3
#: Technical Report", section 4.2): 61 blocks of 7168, latent attention with 128 heads (query
#: latent 1536, key/value latent 512, heads of 128 + 64 rotary and values of 128), 3 dense blocks
#: of SwiGLU 18432, then 256 routed experts of 2048, 8 a token, and 1 shared; vocabulary 129280,
#: untied: 671B parameters. Not modelled: its multi-token-prediction module (14B parameters, one
#: more block and output head), and its router's sigmoid scores chosen in groups (the 16B
#: flavor's softmax router stands in, its top-k scores renormalized as V3's are: element-wise work
#: on 256 scores a token).
PUBLISHED = (
    Preset("deepseek-v3", {"n_layer": 61, "n_dense_layers": 3, "dim": 7168, "n_heads": 128, "q_lora": 1536,
                           "kv_lora": 512, "ffn_hidden": 18432, "n_experts": 256, "top_k": 8, "moe_hidden": 2048,
                           "n_shared_experts": 1, "vocab": 129280}, 4096,
           "DeepSeek-V3 671B (61 layers, 3 dense, d=7168, latent attention 128 heads, 256 experts top-8 + 1 "
           "shared), 4096 tokens, vocab 129280"),
)
PUBLISHED_ROUTER: dict[str, Any] = {**ROUTER, "renormalize": True}


def _published(preset: Preset):
    """The builder of a published model: this architecture with the preset's options."""
    def build(batch: int | None = None, seq_len: int | None = None, **overrides: Any) -> Workload:
        return _build(preset.name, {**DEFAULTS, **preset.options}, batch, seq_len, overrides,
                      fixed=PUBLISHED_ROUTER, default_seq=preset.seq)

    build.__doc__ = f"{preset.name}: token ids (batch, seq), next-token cross entropy over the vocabulary."
    return build


SPEC = ModelSpec(
    name="deepseek-v3-16b",
    summary="DeepSeek-V3 architecture at 16B (torchtitan): latent attention, 64 experts top-6 + 2 shared, "
            "4096 tokens",
    family="decoder",
    default_batch=1,
    default_seq=4096,
    input_desc="4096 tokens, vocab 102400",
    options=OPTIONS,
    build=build,
)

PUBLISHED_SPECS = [p.spec(OPTIONS, _published(p)) for p in PUBLISHED]
