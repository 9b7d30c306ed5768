"""GPT-2 (small, medium, large, xl) in Hugging Face's module layout.

``nn.Linear`` stands in for HF's ``Conv1D`` (same parameters, transposed storage) and the
language-model head is tied to ``wte``, so parameter counts match the published models.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nnperf.errors import ModelOptionError
from nnperf.trace.parallel.pipeline import PipelineSplit
from nnperf.trace.parallel.tensor import TensorParallelPlan, gather_input, logits_layout, styles
from nnperf.workload import Workload

from ._attention import attention, merge_heads, split_heads
from ._losses import TokenCrossEntropy, random_tokens
from ._options import require_divisible, require_positive, resolve_batch_seq, resolve_options
from ._spec import ModelSpec, Preset
from ._workloads import token_workload

OPTIONS = {
    "n_layer": "number of transformer blocks",
    "n_embd": "hidden size",
    "n_head": "attention heads",
    "vocab": "vocabulary size",
    "n_positions": "learned positions (the longest allowed seq_len)",
}
SIZES = {  # name: (n_layer, n_embd, n_head, published parameter count)
    "gpt2": (12, 768, 12, "124M"),
    "gpt2-medium": (24, 1024, 16, "355M"),
    "gpt2-large": (36, 1280, 20, "774M"),
    "gpt2-xl": (48, 1600, 25, "1.56B"),
}
DROPOUT = 0.1


class CausalSelfAttention(nn.Module):
    """Packed q/k/v projection (``c_attn``), causal SDPA, output projection (``c_proj``)."""

    def __init__(self, dim: int, n_head: int) -> None:
        super().__init__()
        self.head_dim = dim // n_head
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.c_proj = nn.Linear(dim, dim)
        self.resid_dropout = nn.Dropout(DROPOUT)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = (split_heads(t, self.head_dim) for t in self.c_attn(x).chunk(3, dim=-1))
        p = DROPOUT if self.training else 0.0
        y = merge_heads(attention(q, k, v, causal=True, dropout_p=p))
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    """4x expansion with tanh-approximated GELU, as in the original GPT-2 code."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.c_fc = nn.Linear(dim, 4 * dim)
        self.c_proj = nn.Linear(4 * dim, dim)
        self.dropout = nn.Dropout(DROPOUT)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


class Block(nn.Module):
    """Pre-norm transformer block."""

    def __init__(self, dim: int, n_head: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim, eps=1e-5)
        self.attn = CausalSelfAttention(dim, n_head)
        self.ln_2 = nn.LayerNorm(dim, eps=1e-5)
        self.mlp = MLP(dim)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


def _embed(chunk: nn.Module, idx: Tensor) -> Tensor:
    """A first pipeline chunk's forward up to its blocks (``pipeline_split``)."""
    positions = torch.arange(idx.shape[1], device=idx.device)
    return chunk.drop(chunk.wte(idx) + chunk.wpe(positions))


class GPT2(nn.Module):
    """Token + learned position embeddings, blocks ``h.N``, ``ln_f``, tied ``lm_head``."""

    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        dim = c["n_embd"]
        self.wte = nn.Embedding(c["vocab"], dim)
        self.wpe = nn.Embedding(c["n_positions"], dim)
        self.drop = nn.Dropout(DROPOUT)
        self.h = nn.ModuleList(Block(dim, c["n_head"]) for _ in range(c["n_layer"]))
        self.ln_f = nn.LayerNorm(dim, eps=1e-5)
        self.lm_head = nn.Linear(dim, c["vocab"], bias=False)
        self.lm_head.weight = self.wte.weight
        self._init_weights(c["n_layer"])

    def _init_weights(self, n_layer: int) -> None:
        """GPT-2's N(0, 0.02) init, residual projections scaled by 1/sqrt(2*n_layer).

        Matters only for real runs: a sensible init keeps the loss and gradients finite.
        """
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * n_layer))
            elif p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def tensor_parallel_plan(self) -> TensorParallelPlan:
        """Megatron's split, written for GPT-2's module names (``_tensor_parallel``)."""
        return TensorParallelPlan("gpt2", _tensor_parallel, lambda c: {
            "n_head": c["n_head"], "4 x n_embd (MLP)": 4 * c["n_embd"]})

    def pipeline_split(self) -> PipelineSplit:
        """Token and position embeddings (and their dropout) before the blocks, the final norm
        and the tied head after (one copy on each end, as Megatron-LM keeps them)."""
        return PipelineSplit(("wte", "wpe", "drop"), "h", "ln_f", "lm_head", _embed)

    def forward(self, idx: Tensor) -> Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(positions))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def _tensor_parallel(model: nn.Module, mesh: Any, sp: bool, loss_parallel: bool) -> None:
    from torch.distributed.tensor.parallel import parallelize_module

    Replicate, Shard, Colwise, Rowwise, SequenceParallel, _, PrepareModuleOutput = styles()
    seq = Shard(1) if sp else Replicate()
    for block in model.h:
        plan: dict[str, Any] = {
            "attn.c_attn": Colwise(), "attn.c_proj": Rowwise(output_layouts=seq),
            "mlp.c_fc": Colwise(), "mlp.c_proj": Rowwise(output_layouts=seq),
        }
        if sp:
            plan.update({"ln_1": SequenceParallel(), "ln_2": SequenceParallel(),
                         "attn": gather_input(), "mlp": gather_input()})
        parallelize_module(block, mesh, plan)
    top: dict[str, Any] = {
        "wte": Rowwise(input_layouts=Replicate(), output_layouts=seq),
        "lm_head": Colwise(input_layouts=seq, **logits_layout(loss_parallel)),
    }
    if sp:
        top["ln_f"] = SequenceParallel()
        top["wpe"] = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(0),
                                         use_local_output=True)
    parallelize_module(model, mesh, top)
    model.lm_head.weight = model.wte.weight  # both Shard(0) over the vocabulary: still tied


#: Published models of GPT-2's block (learned positions, pre-norm LayerNorm, GeLU, tied
#: embeddings) that large Megatron-style runs trained, for ``nnperf plan gpt3-175b``. The
#: vocabulary is as Megatron-LM pads it (--make-vocab-size-divisible-by 128 x tensor parallelism 8).
PUBLISHED = (
    # Brown et al. 2020 ("Language Models are Few-Shot Learners"), Table 2.1: 96 layers, d_model
    # 12288, 96 heads, context 2048; GPT-2's 50257-token vocabulary, padded to 51200
    Preset("gpt3-175b", {"n_layer": 96, "n_embd": 12288, "n_head": 96, "vocab": 51200}, 2048,
           "GPT-3 175B (Brown et al. 2020: 96 layers, d=12288, 96 heads), 2048 tokens, vocab 51200 "
           "(Megatron-LM's padding of 50257)"),
    # Smith et al. 2022 ("Using DeepSpeed and Megatron to Train Megatron-Turing NLG 530B"), 3.1:
    # 105 layers, hidden 20480, 128 heads, sequence 2048
    Preset("mt-nlg-530b", {"n_layer": 105, "n_embd": 20480, "n_head": 128, "vocab": 51200}, 2048,
           "Megatron-Turing NLG 530B (Smith et al. 2022: 105 layers, d=20480, 128 heads), 2048 tokens, "
           "vocab 51200"),
    # BigScience 2022 (arXiv:2211.05100; train/tr11-176B-ml README): 70 layers, hidden 14336, 112
    # heads, sequence 2048, vocabulary padded to 250880. GPT-2's learned positions (2048 x 14336
    # parameters) stand in for BLOOM's ALiBi, which has none; its layer norm after the embedding
    # (2 x 14336) is left out.
    Preset("bloom-176b", {"n_layer": 70, "n_embd": 14336, "n_head": 112, "vocab": 250880}, 2048,
           "BLOOM 176B's shape (BigScience 2022: 70 layers, d=14336, 112 heads, vocab 250880) with GPT-2's "
           "learned positions for ALiBi, 2048 tokens"),
)


def _builder(name: str, n_layer: int, n_embd: int, n_head: int, vocab: int = 50257, positions: int = 1024,
             default_batch: int = 8):
    """GPT-2's builder at one size: ``positions`` the learned positions and the default sequence."""
    defaults: dict[str, Any] = {
        "n_layer": n_layer,
        "n_embd": n_embd,
        "n_head": n_head,
        "vocab": vocab,
        "n_positions": positions,
    }

    def build(batch: int | None = None, seq_len: int | None = None, **overrides: Any) -> Workload:
        batch, seq = resolve_batch_seq(name, batch, seq_len, default_batch, positions)
        c = resolve_options(name, overrides, defaults)
        require_positive(name, c, *defaults)
        require_divisible(name, c, "n_embd", "n_head")
        assert seq is not None
        if seq > c["n_positions"]:
            raise ModelOptionError(f"{name}: seq_len {seq} exceeds n_positions {c['n_positions']} (the learned position "
                                   f"table's length): give -O n_positions={seq} for a model trained at {seq} tokens")
        model = GPT2(c)
        tokens = random_tokens(batch, seq, c["vocab"])
        loss = TokenCrossEntropy(random_tokens(batch, seq, c["vocab"]))
        return token_workload(name, model, tokens, loss, c)

    build.__doc__ = f"{name}: token ids (batch, seq), next-token cross entropy over the vocab."
    return build


SPECS = [
    ModelSpec(
        name=name,
        summary=f"GPT-2 {'small' if name == 'gpt2' else name[5:]} ({size} params, {n_layer} layers,"
        f" d={n_embd}), 1024 tokens",
        family="decoder",
        default_batch=8,
        default_seq=1024,
        input_desc="1024 tokens, vocab 50257",
        options=OPTIONS,
        build=_builder(name, n_layer, n_embd, n_head),
    )
    for name, (n_layer, n_embd, n_head, size) in SIZES.items()
] + [p.spec(OPTIONS, _builder(p.name, p.options["n_layer"], p.options["n_embd"], p.options["n_head"],
                              p.options["vocab"], p.seq, 1)) for p in PUBLISHED]
#: The built-in models whose output head shares the token embedding's weight: this module's.
TIED_EMBEDDINGS = frozenset(spec.name for spec in SPECS)
