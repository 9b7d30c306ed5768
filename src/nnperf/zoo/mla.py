"""Multi-head latent attention (MLA), DeepSeek-V2/V3's attention, as torchtitan writes it
(``torchtitan/models/deepseek_v3/model/model.py``, ``Attention``).

Keys and values come from one low-rank latent per token: ``wkv_a`` projects the hidden state to
``kv_lora`` latent features plus one rotary key of ``qk_rope_dim`` shared by every head, the
latent is RMS-normalized and ``wkv_b`` expands it to each head's non-rotary key
(``qk_nope_dim``) and value (``v_head_dim``). Queries come from ``wq`` (``q_lora`` 0) or from
their own latent (``wq_a``, ``q_norm``, ``wq_b``). A head's key is its non-rotary part joined
to the shared rotary part, so queries and keys are ``qk_nope_dim + qk_rope_dim`` wide and
values ``v_head_dim``: SDPA gets unequal head sizes, which rules out the flash kernel
(``kernels.attention``). The rotation uses the real-arithmetic half-split form of
``zoo.llama`` (in the activations' dtype, tables built per layer) where torchtitan multiplies
complex numbers in fp32 from one precomputed table: element-wise work on the same
``qk_rope_dim`` features, a few bytes per token apart.

Tensor parallelism (``tensor_parallel_styles``) splits it as Megatron-Core's ``MLASelfAttention`` does
(``megatron/core/transformer/multi_latent_attention.py``, its down-projections built as
``TELinear(parallel_mode="duplicated")``): the down-projections and their norms are replicated
and run on the rank's own tokens (the sequence shard under sequence parallelism, every token
without), the up-projections are split by heads (column-parallel: under sequence parallelism
they gather the *latent* over the sequence, not the hidden state), the shared rotary key is
gathered whole (``SharedRotaryKey``) and the output projection is row-parallel. torchtitan's
plan for the same model gathers the hidden state before the down-projections instead and
runs them on every token on every rank: more bytes gathered (``dim`` against the latents'
``q_lora + kv_lora + qk_rope_dim``) and the down-projections' FLOPs repeated on each rank.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import BlockMask

from nnperf.trace.parallel.tensor import styles

from ._attention import attention
from .llama import RMSNorm, apply_rotary, own_block_mask, rotary_tables


class SharedRotaryKey(nn.Module):
    """The rotary key every head shares (``qk_rope_dim`` features a token). Alone it passes its
    input through. Under tensor parallelism it arrives as a DTensor (the rank's sequence shard
    under sequence parallelism, else replicated) and every rank's heads use all of it, so it is
    gathered whole and its gradient, each rank's heads' share of it, summed over the ranks in
    backward: Megatron-Core's ``gather_from_sequence_parallel_region`` of ``k_pos_emb``."""

    def forward(self, k_pe: Tensor) -> Tensor:
        from torch.distributed.tensor import DTensor, Partial, Replicate

        if not isinstance(k_pe, DTensor):
            return k_pe
        return k_pe.redistribute(placements=[Replicate()]).to_local(grad_placements=[Partial()])


class MultiHeadLatentAttention(nn.Module):
    """Queries, the shared key/value latent, causal SDPA and the output projection."""

    def __init__(self, dim: int, n_heads: int, q_lora: int, kv_lora: int, qk_nope_dim: int, qk_rope_dim: int,
                 v_head_dim: int, flex_doc_len: int | None = None) -> None:
        super().__init__()
        self.flex_doc_len = flex_doc_len
        self.qk_nope_dim, self.qk_rope_dim, self.v_head_dim = qk_nope_dim, qk_rope_dim, v_head_dim
        self.qk_head_dim = qk_nope_dim + qk_rope_dim
        self.kv_lora = kv_lora
        if q_lora:
            self.wq_a = nn.Linear(dim, q_lora, bias=False)
            self.q_norm = RMSNorm(q_lora)
            self.wq_b = nn.Linear(q_lora, n_heads * self.qk_head_dim, bias=False)
        else:
            self.wq = nn.Linear(dim, n_heads * self.qk_head_dim, bias=False)
        self.wkv_a = nn.Linear(dim, kv_lora + qk_rope_dim, bias=False)
        self.kv_norm = RMSNorm(kv_lora)
        self.wkv_b = nn.Linear(kv_lora, n_heads * (qk_nope_dim + v_head_dim), bias=False)
        self.wo = nn.Linear(n_heads * v_head_dim, dim, bias=False)
        self.shared_rotary_key = SharedRotaryKey()

    def forward(self, x: Tensor, block_mask: BlockMask | None = None) -> Tensor:
        q = self.wq(x) if hasattr(self, "wq") else self.wq_b(self.q_norm(self.wq_a(x)))
        b, t = q.shape[:2]  # every token: x may be a sequence shard (tensor_parallel_styles)
        q = q.view(b, t, -1, self.qk_head_dim).transpose(1, 2)  # heads follow the width (a TP shard's own)
        q_nope, q_pe = torch.split(q, [self.qk_nope_dim, self.qk_rope_dim], dim=-1)
        latent, k_pe = torch.split(self.wkv_a(x), [self.kv_lora, self.qk_rope_dim], dim=-1)
        cos, sin = rotary_tables(t, self.qk_rope_dim, q)
        q = torch.cat([q_nope, apply_rotary(q_pe, cos, sin)], dim=-1)
        k_pe = self.shared_rotary_key(k_pe)
        k_pe = apply_rotary(k_pe.unsqueeze(1), cos, sin)  # (b, 1, t, rope): one rotary key for all heads
        kv = self.wkv_b(self.kv_norm(latent)).view(b, t, -1, self.qk_nope_dim + self.v_head_dim).transpose(1, 2)
        k_nope, v = torch.split(kv, [self.qk_nope_dim, self.v_head_dim], dim=-1)
        k = torch.cat([k_nope, k_pe.expand(-1, k_nope.shape[1], -1, -1)], dim=-1)
        block_mask = own_block_mask(self.flex_doc_len, block_mask, x, t)
        if block_mask is not None:
            out = attention(q, k, v, causal=True, block_mask=block_mask)
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, t, -1))


def tensor_parallel_styles(attention: MultiHeadLatentAttention, sequence_parallel: bool) -> dict[str, Any]:
    """The ``parallelize_module`` plan of one latent attention, keyed by its submodules' names
    (module docstring): replicated down-projections and norms on the rank's tokens, whose
    outputs stay DTensors so the column-parallel up-projections gather them (sequence
    parallel) or reduce their gradients (not), and a row-parallel output projection."""
    Replicate, Shard, Colwise, Rowwise, *_ = styles()
    tokens = Shard(1) if sequence_parallel else Replicate()
    down = [name for name in ("wq_a", "q_norm", "wkv_a", "kv_norm") if hasattr(attention, name)]
    plan: dict[str, Any] = {name: replicated_on_tokens(tokens) for name in down}
    plan["wq" if hasattr(attention, "wq") else "wq_b"] = Colwise(input_layouts=tokens)
    plan["wkv_b"] = Colwise(input_layouts=tokens)
    plan["wo"] = Rowwise(output_layouts=tokens)
    return plan


def replicated_on_tokens(tokens: Any) -> Any:
    """A replicated module on the rank's tokens (``tokens``: ``Shard(1)``, the sequence shard, or
    ``Replicate()``, every token) whose output stays a DTensor: PyTorch's ``SequenceParallel``
    style for the one, torchtitan's ``NoParallel`` for the other."""
    from torch.distributed.tensor.parallel import SequenceParallel

    return SequenceParallel(use_local_output=False) if tokens.is_shard() else _no_parallel()()


@functools.cache
def _no_parallel() -> type:
    """torchtitan's ``NoParallel`` (``torchtitan/distributed/tensor_parallel.py``): parameters
    replicated, plain inputs taken as replicated DTensors, outputs left DTensors (made once:
    ``torch.distributed`` is imported only when tensor parallelism is applied)."""
    from torch.distributed.tensor import DTensor, Replicate, distribute_module
    from torch.distributed.tensor.parallel import ParallelStyle

    def to_dtensor(module: nn.Module, inputs: Any, mesh: Any) -> Any:
        return tuple(DTensor.from_local(x, mesh, [Replicate()], run_check=False)
                     if isinstance(x, Tensor) and not isinstance(x, DTensor) else x for x in inputs)

    class NoParallel(ParallelStyle):
        def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
            return distribute_module(module, device_mesh, None, to_dtensor, None)

    return NoParallel
