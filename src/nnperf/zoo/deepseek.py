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

from ._spec import ModelSpec
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
