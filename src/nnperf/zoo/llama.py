"""LLaMA-7B in Meta's reference layout (``tok_embeddings``, ``layers.N.attention.wq``, ...).

Rotary tables are computed in ``forward`` from ``torch.arange`` so the model has no buffers
tied to a maximum length and traces cleanly on fake tensors. ``n_kv_heads`` below
``n_heads`` gives grouped-query attention (LLaMA-2 70B style).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import BlockMask

from nnperf.errors import ModelOptionError
from nnperf.trace.parallel.pipeline import PipelineSplit
from nnperf.trace.parallel.tensor import TensorParallelPlan, gather_input, logits_layout, styles
from nnperf.workload import Workload

from ._attention import ATTENTION_KINDS, attention, causal_block_mask, merge_heads, split_heads
from ._losses import TokenCrossEntropy, random_tokens
from ._options import (
    require_choice,
    require_divisible,
    require_positive,
    resolve_batch_seq,
    resolve_options,
)
from ._spec import ModelSpec, Preset
from ._workloads import token_workload
from .moe import MoE

DEFAULTS: dict[str, Any] = {
    "n_layer": 32,
    "dim": 4096,
    "n_heads": 32,
    "n_kv_heads": 32,
    "head_dim": 0,
    "ffn_hidden": 11008,
    "vocab": 32000,
    "n_experts": 0,
    "top_k": 2,
    "moe_hidden": 0,
    "attention": "sdpa",
    "doc_len": 0,
    "mlp": "swiglu",
    "norm": "rmsnorm",
    "qk_norm": False,
}
#: The dense feed-forwards and norms a block may have (``mlp``, ``norm``).
MLP_KINDS = ("swiglu", "squared-relu")
NORM_KINDS = ("rmsnorm", "layernorm")
#: The block's shape beyond its sizes: the feed-forward and the norms.
BLOCK_OPTIONS = {
    "mlp": "the dense feed-forward: swiglu (w2(silu(w1 x) * w3 x), LLaMA's) or squared-relu "
           "(w2(relu(w1 x)^2), Nemotron-4's and Megatron-LM's --squared-relu: two matrices, "
           "ffn_hidden wide)",
    "norm": "rmsnorm (LLaMA's) or layernorm (Nemotron-4's, with a bias; Megatron-LM's "
            "--normalization LayerNorm)",
    "qk_norm": "true: an RMSNorm over each head's query and key before the rotary embedding (Qwen3's "
               "q_norm and k_norm; Megatron-LM's --qk-layernorm)",
}
#: How every zoo decoder may attend (``zoo._attention``): its ``attention`` and ``doc_len``.
ATTENTION_OPTIONS = {
    "attention": "sdpa (F.scaled_dot_product_attention, causal) or flex (FlexAttention with a causal "
                 "BlockMask built once per forward, torchtitan's use_flex_attn)",
    "doc_len": "with attention=flex: block-causal masking over documents of this many tokens packed "
               "in each sequence (torchtitan's block_causal; real documents vary in length, and for "
               "the same mean length, work grows with the spread); 0: plain causal",
}
OPTIONS = {
    "n_layer": "number of transformer blocks",
    "dim": "hidden size",
    "n_heads": "query heads",
    "n_kv_heads": "key/value heads (fewer than n_heads = grouped-query attention)",
    "head_dim": "features per head (0: dim / n_heads; Qwen3's 128 beside a hidden size of 2048 or 4096)",
    "ffn_hidden": "SwiGLU hidden size",
    "vocab": "vocabulary size",
    "n_experts": "experts per mixture-of-experts feed-forward (0: dense SwiGLU)",
    "top_k": "experts each token is routed to (with n_experts)",
    "moe_hidden": "each expert's SwiGLU hidden size (0: ffn_hidden)",
    **ATTENTION_OPTIONS,
    **BLOCK_OPTIONS,
}
#: Mixtral 8x7B (Jiang et al. 2024, "Mixtral of Experts", Table 1; its config.json): Llama-2's
#: block with grouped-query attention and 8 SwiGLU experts, 2 per token.
MIXTRAL_8X7B: dict[str, Any] = {"n_layer": 32, "dim": 4096, "n_heads": 32, "n_kv_heads": 8, "ffn_hidden": 14336,
                                "vocab": 32000, "n_experts": 8, "top_k": 2}
NORM_EPS = 1e-6
ROPE_THETA = 10000.0


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in float32 as the reference code does."""

    def __init__(self, dim: int, eps: float = NORM_EPS) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.type_as(x) * self.weight


def rotary_tables(seq: int, head_dim: int, like: Tensor) -> tuple[Tensor, Tensor]:
    """cos/sin of shape (seq, head_dim), built from arange so no state depends on length."""
    inv_freq = 1.0 / ROPE_THETA ** (
        torch.arange(0, head_dim, 2, device=like.device, dtype=torch.float32) / head_dim
    )
    angles = torch.outer(torch.arange(seq, device=like.device, dtype=torch.float32), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(like.dtype), angles.sin().to(like.dtype)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate (B, H, T, D) by position, half-split convention (same cost as interleaved)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Attention(nn.Module):
    """Bias-free q/k/v/o projections, rotary q/k, causal SDPA (GQA when n_kv_heads < n_heads),
    or FlexAttention under the model's block mask (``flex_doc_len`` not None: ``doc_len``).
    ``qk_norm``: each head's query and key RMS-normalized over its features first, one weight
    of ``head_dim`` shared by the heads (Qwen3's ``q_norm``/``k_norm``, transformers'
    ``Qwen3Attention``)."""

    def __init__(self, dim: int, n_heads: int, n_kv_heads: int, flex_doc_len: int | None = None,
                 head_dim: int = 0, qk_norm: bool = False) -> None:
        super().__init__()
        self.flex_doc_len = flex_doc_len
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.head_dim = head_dim or dim // n_heads
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)
        if qk_norm:
            self.q_norm = RMSNorm(self.head_dim)
            self.k_norm = RMSNorm(self.head_dim)

    def forward(self, x: Tensor, block_mask: BlockMask | None = None) -> Tensor:
        q = split_heads(self.wq(x), self.head_dim)
        k = split_heads(self.wk(x), self.head_dim)
        v = split_heads(self.wv(x), self.head_dim)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = rotary_tables(x.shape[1], self.head_dim, q)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        block_mask = own_block_mask(self.flex_doc_len, block_mask, x)
        return self.wo(merge_heads(attention(q, k, v, causal=True, block_mask=block_mask)))


def own_block_mask(flex_doc_len: int | None, given: BlockMask | None, like: Tensor, seq: int | None = None
                   ) -> BlockMask | None:
    """The block mask an attention layer attends with: the model's, else (a pipeline stage runs
    the layers without the model's forward) its own over ``seq`` tokens (``like.shape[1]`` by
    default) on ``like``'s device; None for SDPA."""
    if flex_doc_len is None or given is not None:
        return given
    return causal_block_mask(like.shape[1] if seq is None else seq, flex_doc_len, like.device)


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class SquaredReluFeedForward(nn.Module):
    """Nemotron-4's feed-forward (Megatron-LM's ``--squared-relu``, no gate): w2(relu(w1 x)^2)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(torch.square(F.relu(self.w1(x))))


def dense_feed_forward(c: dict[str, Any]) -> nn.Module:
    """The block's dense feed-forward of kind ``c["mlp"]`` (``MLP_KINDS``)."""
    kind = c.get("mlp", "swiglu")
    return SquaredReluFeedForward(c["dim"], c["ffn_hidden"]) if kind == "squared-relu" else \
        FeedForward(c["dim"], c["ffn_hidden"])


def block_norm(c: dict[str, Any]) -> nn.Module:
    """A norm of kind ``c["norm"]`` (``NORM_KINDS``) over the hidden size."""
    return nn.LayerNorm(c["dim"], eps=NORM_EPS) if c.get("norm", "rmsnorm") == "layernorm" else RMSNorm(c["dim"])


class TransformerBlock(nn.Module):
    """Attention (grouped-query, or DeepSeek's latent attention when the config has a
    ``kv_lora``) and a feed-forward: dense (``feed_forward``) or a mixture of experts (``moe``,
    torchtitan's name for it) from block ``n_dense_layers`` on, with ``n_shared_experts``
    experts' width of always-on SwiGLU beside the routed ones."""

    def __init__(self, c: dict[str, Any], index: int = 0) -> None:
        super().__init__()
        if c.get("kv_lora"):
            from .mla import MultiHeadLatentAttention

            self.attention = MultiHeadLatentAttention(c["dim"], c["n_heads"], c["q_lora"], c["kv_lora"],
                                                      c["qk_nope_dim"], c["qk_rope_dim"], c["v_head_dim"],
                                                      flex_doc_len(c))
        else:
            self.attention = Attention(c["dim"], c["n_heads"], c["n_kv_heads"], flex_doc_len(c), c.get("head_dim", 0),
                                       c.get("qk_norm", False))
        if c["n_experts"] and index >= c.get("n_dense_layers", 0):
            hidden = c["moe_hidden"] or c["ffn_hidden"]
            shared = FeedForward(c["dim"], hidden * c["n_shared_experts"]) if c.get("n_shared_experts") else None
            self.moe = MoE(c["dim"], hidden, c["n_experts"], c["top_k"], shared,
                           renormalize=c.get("renormalize", True),
                           score_before_experts=c.get("score_before_experts", True),
                           expert_bias=c.get("expert_bias", False))
        else:
            self.feed_forward = dense_feed_forward(c)
        self.attention_norm = block_norm(c)
        self.ffn_norm = block_norm(c)

    def forward(self, x: Tensor, block_mask: BlockMask | None = None) -> Tensor:
        x = x + self.attention(self.attention_norm(x), block_mask=block_mask)
        ffn = self.moe if hasattr(self, "moe") else self.feed_forward
        return x + ffn(self.ffn_norm(x))


class Llama(nn.Module):
    """Embedding, blocks, final norm (RMSNorm unless ``norm``), untied ``output`` projection to
    the vocabulary."""

    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(c["vocab"], c["dim"])
        self.layers = nn.ModuleList(TransformerBlock(c, i) for i in range(c["n_layer"]))
        self.norm = block_norm(c)
        self.output = nn.Linear(c["dim"], c["vocab"], bias=False)
        self.flex_doc_len = flex_doc_len(c)
        for p in self.parameters():  # LLaMA-style small init keeps real runs' loss finite
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    #: ``--loss chunked`` (``trace.loss.ChunkedLoss``): forward stops at the final norm and the
    #: loss runs the output projection chunk by chunk, as torchtitan's ``_skip_lm_head``.
    skip_head = False

    def chunkable_head(self) -> nn.Linear:
        return self.output

    def tensor_parallel_plan(self) -> TensorParallelPlan:
        """torchtitan's ``apply_tp`` for Llama (``_tensor_parallel``), its mixture-of-experts
        layers split as Megatron-Core splits them (``trace.parallel.expert_tensor``) and
        multi-head latent attention as Megatron-Core splits it (``zoo.mla.tensor_parallel_styles``)."""
        return TensorParallelPlan("llama", _tensor_parallel, _split_sizes)

    def pipeline_split(self) -> PipelineSplit:
        """torchtitan's manual split: the embedding before the blocks, the norm and the output
        projection after (a chunked loss may take the projection over)."""
        return PipelineSplit(("tok_embeddings",), "layers", "norm", "output", lambda c, t: c.tok_embeddings(t),
                             chunkable=True)

    def forward(self, tokens: Tensor) -> Tensor:
        x = self.tok_embeddings(tokens)
        # FlexAttention: one mask for every layer, forward and backward (torchtitan builds it
        # once per batch too)
        block_mask = own_block_mask(self.flex_doc_len, None, tokens)
        for layer in self.layers:
            x = layer(x, block_mask=block_mask)
        x = self.norm(x)
        return x if self.skip_head else self.output(x)


def _split_sizes(c: dict[str, Any]) -> dict[str, int]:
    """The sizes a tensor-parallel degree must divide: heads, the feed-forward's hidden size
    and the experts'."""
    sizes = {"n_heads": c["n_heads"], "ffn_hidden": c["ffn_hidden"]}
    if not c.get("kv_lora"):  # latent attention's keys and values are per query head
        sizes["n_kv_heads"] = c["n_kv_heads"]
    if c.get("n_experts") and c.get("moe_hidden"):
        sizes["moe_hidden"] = c["moe_hidden"]
    return sizes


def _tensor_parallel(model: nn.Module, mesh: Any, sp: bool, loss_parallel: bool) -> None:
    """torchtitan's ``apply_tp`` for Llama; its mixture-of-experts layers as Megatron-Core
    splits them (``trace.parallel.expert_tensor.split_moe``)."""
    from torch.distributed.tensor.parallel import parallelize_module

    from nnperf.trace.parallel.expert_tensor import split_moe

    from .mla import MultiHeadLatentAttention
    from .mla import tensor_parallel_styles as latent_attention_styles

    Replicate, Shard, Colwise, Rowwise, SequenceParallel, *_ = styles()
    seq = Shard(1) if sp else Replicate()
    for layer in model.layers:
        latent = isinstance(layer.attention, MultiHeadLatentAttention)
        if latent:
            plan: dict[str, Any] = {f"attention.{name}": style
                                    for name, style in latent_attention_styles(layer.attention, sp).items()}
        else:
            plan = {"attention.wq": Colwise(), "attention.wk": Colwise(), "attention.wv": Colwise(),
                    "attention.wo": Rowwise(output_layouts=seq)}
        moe = getattr(layer, "moe", None)
        if moe is None:
            plan.update({"feed_forward.w1": Colwise(), "feed_forward.w2": Rowwise(output_layouts=seq)})
            if isinstance(layer.feed_forward, FeedForward):  # the gate (SwiGLU's w3)
                plan["feed_forward.w3"] = Colwise()
        if sp:
            plan.update({"attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel()})
            if not latent:  # latent attention gathers its latents, not the hidden state
                plan["attention"] = gather_input()
            if moe is None:
                plan["feed_forward"] = gather_input()
        if moe is not None:
            split_moe(moe, mesh, sp)
        parallelize_module(layer, mesh, plan)
    top: dict[str, Any] = {
        "tok_embeddings": Rowwise(input_layouts=Replicate(), output_layouts=seq),
        "output": Colwise(input_layouts=seq, **logits_layout(loss_parallel)),
    }
    if sp:
        top["norm"] = SequenceParallel()
    parallelize_module(model, mesh, top)


def build(batch: int | None = None, seq_len: int | None = None, **overrides: Any) -> Workload:
    """Token ids (batch, seq); next-token cross entropy over the vocabulary."""
    return _build("llama-7b", DEFAULTS, batch, seq_len, overrides)


def build_mixtral(batch: int | None = None, seq_len: int | None = None, **overrides: Any) -> Workload:
    return _build("mixtral-8x7b", {**DEFAULTS, **MIXTRAL_8X7B}, batch, seq_len, overrides)


#: Options that may be 0 (off): experts, their width, DeepSeek's dense blocks, shared experts,
#: query latent and documents.
MAY_BE_ZERO = frozenset({"n_experts", "moe_hidden", "n_dense_layers", "n_shared_experts", "q_lora", "doc_len",
                         "head_dim"})


def flex_doc_len(c: dict[str, Any]) -> int | None:
    """The document length of a FlexAttention model's mask (0: causal), None for SDPA."""
    return c.get("doc_len", 0) if c.get("attention", "sdpa") == "flex" else None


def _build(name: str, defaults: dict[str, Any], batch: int | None, seq_len: int | None,
           overrides: dict[str, Any], fixed: dict[str, Any] | None = None, default_seq: int = 4096) -> Workload:
    """``defaults``: the options a user may set; ``fixed``: the rest of the architecture."""
    batch, seq = resolve_batch_seq(name, batch, seq_len, SPEC.default_batch, default_seq)
    assert seq is not None
    user_set_kv = "n_kv_heads" in overrides
    c = resolve_options(name, overrides, defaults)
    if not user_set_kv and name == "llama-7b":
        c["n_kv_heads"] = c["n_heads"]  # plain multi-head attention unless asked otherwise
    # sizes and counts (the named choices are strings)
    require_positive(name, c, *(k for k, v in defaults.items()
                                if isinstance(v, int) and not isinstance(v, bool) and k not in MAY_BE_ZERO))
    _check_attention(name, c)
    _check_block(name, c)
    for key in MAY_BE_ZERO & set(defaults):
        if c[key] < 0:
            raise ModelOptionError(f"{name}: {key} must be 0 or more, got {c[key]}")
    if c["n_experts"] and not 1 <= c["top_k"] <= c["n_experts"]:
        raise ModelOptionError(f"{name}: top_k must be between 1 and n_experts ({c['n_experts']}), got {c['top_k']}")
    if "kv_lora" in c:  # latent attention: heads are sized by their own options
        if c["qk_rope_dim"] % 2:
            raise ModelOptionError(f"{name}: qk_rope_dim must be even for rotary embeddings, got {c['qk_rope_dim']}")
    else:
        if not c.get("head_dim"):
            require_divisible(name, c, "dim", "n_heads")
        require_divisible(name, c, "n_heads", "n_kv_heads")
        if (c.get("head_dim") or c["dim"] // c["n_heads"]) % 2:
            raise ModelOptionError(f"{name}: the head size (head_dim, or dim / n_heads) must be even for rotary "
                                   "embeddings")
    model = Llama({**c, **(fixed or {})})
    tokens = random_tokens(batch, seq, c["vocab"])
    loss = TokenCrossEntropy(random_tokens(batch, seq, c["vocab"]))
    return token_workload(name, model, tokens, loss, c)


def _check_block(name: str, c: dict[str, Any]) -> None:
    require_choice(name, c, "mlp", MLP_KINDS)
    require_choice(name, c, "norm", NORM_KINDS)
    if c.get("mlp", "swiglu") != "swiglu" and c["n_experts"]:
        raise ModelOptionError(f"{name}: mlp={c['mlp']} is the dense feed-forward's; the experts (n_experts) are "
                               "SwiGLU: set n_experts=0 or leave mlp out")


def _check_attention(name: str, c: dict[str, Any]) -> None:
    require_choice(name, c, "attention", ATTENTION_KINDS)
    if c.get("doc_len", 0) < 0:
        raise ModelOptionError(f"{name}: doc_len must be 0 or more, got {c['doc_len']}")
    if c.get("doc_len", 0) and c["attention"] != "flex":
        raise ModelOptionError(f"{name}: doc_len (document masking) needs attention=flex; SDPA here is "
                               "plain causal")


SPEC = ModelSpec(
    name="llama-7b",
    summary="LLaMA-7B decoder (RMSNorm, SwiGLU, RoPE, untied head), 4096 tokens",
    family="decoder",
    default_batch=1,
    default_seq=4096,
    input_desc="4096 tokens, vocab 32000",
    options=OPTIONS,
    build=build,
)

#: Published models of this block that large runs trained (Llama 2 and 3 on Meta's own stack,
#: Nemotron-4 on Megatron-Core), for ``nnperf plan llama3-70b``. Each one's config.json or paper:
#: Llama 2 (Touvron et al. 2023, Table 1; meta-llama/Llama-2-70b-hf), Llama 3 and 3.1 (Grattafiori
#: et al. 2024, Table 3; meta-llama/Meta-Llama-3-8B, -70B, Llama-3.1-405B), Nemotron-4 340B
#: (Parmar et al. 2024, Table 1: 96 layers, hidden 18432, 96 heads, 8 KV heads, sequence 4096,
#: 256000-token vocabulary; squared-ReLU MLP of 4 x the hidden size, LayerNorm, untied
#: embeddings, as the NeMo-Framework-Launcher's nemotron_340b.yaml).
PUBLISHED = (
    Preset("llama2-70b", {"n_layer": 80, "dim": 8192, "n_heads": 64, "n_kv_heads": 8, "ffn_hidden": 28672,
                          "vocab": 32000}, 4096,
           "Llama 2 70B (80 layers, d=8192, GQA 64/8, FFN 28672), 4096 tokens, vocab 32000"),
    Preset("llama3-8b", {"n_layer": 32, "dim": 4096, "n_heads": 32, "n_kv_heads": 8, "ffn_hidden": 14336,
                         "vocab": 128256}, 8192,
           "Llama 3 8B (32 layers, d=4096, GQA 32/8, FFN 14336), 8192 tokens, vocab 128256"),
    Preset("llama3-70b", {"n_layer": 80, "dim": 8192, "n_heads": 64, "n_kv_heads": 8, "ffn_hidden": 28672,
                          "vocab": 128256}, 8192,
           "Llama 3 70B (80 layers, d=8192, GQA 64/8, FFN 28672), 8192 tokens, vocab 128256"),
    Preset("llama3.1-405b", {"n_layer": 126, "dim": 16384, "n_heads": 128, "n_kv_heads": 8, "ffn_hidden": 53248,
                             "vocab": 128256}, 8192,
           "Llama 3.1 405B (126 layers, d=16384, GQA 128/8, FFN 53248), 8192 tokens, vocab 128256"),
    Preset("nemotron4-340b", {"n_layer": 96, "dim": 18432, "n_heads": 96, "n_kv_heads": 8, "ffn_hidden": 73728,
                              "vocab": 256000, "mlp": "squared-relu", "norm": "layernorm"}, 4096,
           "Nemotron-4 340B (96 layers, d=18432, GQA 96/8, squared-ReLU FFN 73728, LayerNorm), 4096 tokens, "
           "vocab 256000"),
)


def _published(preset: Preset):
    """The builder of a published model: the block's defaults with the preset's options."""
    def build(batch: int | None = None, seq_len: int | None = None, **overrides: Any) -> Workload:
        return _build(preset.name, {**DEFAULTS, **preset.options}, batch, seq_len, overrides, default_seq=preset.seq)

    build.__doc__ = f"{preset.name}: token ids (batch, seq), next-token cross entropy over the vocabulary."
    return build


PUBLISHED_SPECS = [p.spec(OPTIONS, _published(p)) for p in PUBLISHED]

MIXTRAL = ModelSpec(
    name="mixtral-8x7b",
    summary="Mixtral 8x7B: LLaMA blocks with GQA and 8 SwiGLU experts, top-2 routing, 4096 tokens",
    family="decoder",
    default_batch=1,
    default_seq=4096,
    input_desc="4096 tokens, vocab 32000",
    options=OPTIONS,
    build=build_mixtral,
)
