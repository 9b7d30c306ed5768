"""Fused attention (SDPA) where the model computes attention by hand.

(A step traced with ``--sdpa unfused`` calls SDPA already: the item is then its fused kernel,
re-traced with ``--sdpa fused``, and its unfused kernels are not taken for attention by hand.)

Found in the trace: in one module's forward, a softmax over the output of a matrix product
of activations (no weights), whose result feeds a second such product. Every op of that
module touching the score-shaped (query x key) tensors, forward and backward, is replaced
by one ``nnperf::attention`` and one ``nnperf::attention_backward`` op, costed by the same
formulas and attention model as a traced ``F.scaled_dot_product_attention``.

And FlexAttention for a built-in decoder on SDPA (``flex-attention``): the step re-traced with
the model's ``attention=flex`` option.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

import nnperf.trace.attention  # noqa: F401  (defines the nnperf:: ops)
from nnperf.passes.costs import registry as cat
from nnperf.passes.count import OpCount
from nnperf.search.advise.change import Candidate, Change
from nnperf.search.advise.rewrite import Rewritten, count_events, rebuild, synthetic
from nnperf.trace.events import TensorMeta

if TYPE_CHECKING:
    from nnperf.search.advise.evaluate import Base

_MASKS = ("aten.masked_fill", "aten.where")


@dataclass
class HandAttention:
    module: str
    scores: tuple[int, ...]  # shape of the (query x key) tensors
    q: TensorMeta
    k: TensorMeta  # as (..., keys, head_dim)
    v: TensorMeta
    out: TensorMeta
    causal: bool
    dropout: bool


def find(counts: list[OpCount]) -> list[HandAttention]:
    by_module: dict[str, list[OpCount]] = defaultdict(list)
    for c in counts:
        if c.phase == "forward":
            by_module[c.module].append(c)
    found = []
    for module, ops in by_module.items():
        soft = next((c for c in ops if "softmax" in c.op and c.event.inputs), None)
        if soft is None:
            continue
        scores = soft.event.inputs[0].shape
        products = [c for c in ops if c.category == cat.GEMM and not c.bytes_weights and c.event.outputs]
        qk = next((c for c in products if _is_scores(c.event.outputs[0], scores)), None)
        pv = next((c for c in products if any(_is_scores(m, scores) for m in c.event.inputs)
                   and c.index > soft.index), None)
        if qk is None or pv is None or len(qk.event.inputs) < 2 or len(pv.event.inputs) < 2:
            continue
        q, kt = qk.event.inputs[:2]
        k = TensorMeta(kt.storage, (*kt.shape[:-2], kt.shape[-1], kt.shape[-2]), kt.dtype, kt.stride)
        v = next(m for m in pv.event.inputs if not _is_scores(m, scores))
        chain = [c for c in ops if _touches(c, scores)]
        found.append(HandAttention(
            module, scores, q, k, v, pv.event.outputs[0],
            causal=any(c.op in _MASKS for c in chain), dropout=any("dropout" in c.op for c in chain)))
    return found


def _is_scores(m: TensorMeta, scores: tuple[int, ...]) -> bool:
    """The score tensor, or a view of it with the heads folded into the batch (bmm's)."""
    return m.shape[-2:] == scores[-2:] and m.numel == math.prod(scores)


def _touches(c: OpCount, scores: tuple[int, ...]) -> bool:
    return any(_is_scores(m, scores) for m in (*c.event.inputs, *c.event.outputs))


def candidates(base: Base) -> list[Candidate]:
    return _fused(base) + _flex(base)


def _attention_is_an_option(target: object) -> bool:
    """A built-in decoder whose attention is an option (``-O attention=sdpa|flex``)."""
    from nnperf.zoo import find_model

    spec = find_model(target)
    return spec is not None and "attention" in spec.options


def _flex(base: Base) -> list[Candidate]:
    """A built-in decoder attending with SDPA, re-traced with FlexAttention (``-O
    attention=flex``): the same causal mask, inductor's Triton kernel at its published share of
    flash's rate. Where SDPA has only its memory-efficient kernel (latent attention's 192/128
    heads) that is the change torchtitan made for DeepSeek-V3 (PR #1610: 6,721 -> 8,667 tokens/s
    per H100, with document masking too)."""
    request = base.setup.request
    if not _attention_is_an_option(request.target) or str(request.overrides.get("attention", "sdpa")) != "sdpa":
        return []
    if base.options.trace.sdpa != "fused":
        return []
    if not any(c.op == "nnperf.attention" for c in base.analysis.ops):
        return []
    return [Candidate(
        name="flex-attention", family="attention",
        title="FlexAttention instead of SDPA, causal (torch.compile(flex_attention) with a causal BlockMask)",
        change=Change(model=(("attention", "flex"),)),
        how="block_mask = create_block_mask(lambda b, h, q, kv: q >= kv, None, None, T, T); "
            "y = torch.compile(flex_attention)(q, k, v, block_mask=block_mask)  "
            "(torchtitan: the flavor's use_flex_attn = True; nnperf: -O attention=flex)",
        layers=["(every attention layer)"],
        assumptions=["FlexAttention's kernel at its published share of flash's rate "
                     "(flex_attention_forward_scale / _backward_scale of the profile), over the pairs of "
                     "the 128 x 128 blocks the causal mask keeps", "compile time not counted"],
    )]


def _fused(base: Base) -> list[Candidate]:
    if base.options.trace.sdpa == "unfused":  # the model calls SDPA: its fused kernel, re-traced
        return [Candidate(
            name="sdpa", family="attention",
            title="fused attention: SDPA's flash or memory-efficient kernel instead of its unfused kernels",
            change=Change(trace=(("sdpa", "fused"),)),
            how="a GPU and dtype SDPA has a fused kernel for, nothing forcing its math backend "
                "(torch.nn.attention.sdpa_kernel); Megatron-LM: --attention-backend flash "
                "(nnperf: --sdpa fused)",
            layers=["(every scaled_dot_product_attention call)"],
            assumptions=["the same attention computed by one fused kernel forward and one backward"],
        )]
    found = find(base.analysis.ops)
    if not found:
        return []
    causal = found[0].causal
    return [Candidate(
        name="sdpa", family="attention",
        title=f"fused attention (SDPA) instead of attention by hand in {len(found)} module(s)",
        change=Change(sdpa=True),
        how=f"y = F.scaled_dot_product_attention(q, k, v, is_causal={causal}, dropout_p=p)  "
            "# replaces q @ k.transpose(-2, -1), scale, mask, softmax, dropout, @ v",
        layers=[h.module for h in found],
        assumptions=[
            "every op of the module touching the (query x key) scores is replaced by one fused "
            "forward and one fused backward kernel (flash backward recomputes the scores)",
            "a masked_fill/where on the scores is taken as a causal mask" if causal else
            "no mask on the scores: full (non-causal) attention",
            "memory: the saved score-sized tensors are no longer kept for backward",
        ],
    )]


def rewrite(rw: Rewritten) -> None:
    found = {h.module: h for h in find(rw.counts)}
    if not found:
        return
    consumers: dict[int, set[str]] = defaultdict(set)
    for ev in rw.trace.events:
        for m in ev.inputs:
            consumers[m.storage].add(ev.phase)
    edits: dict[int, list[OpCount]] = {}
    for module, h in found.items():
        fwd = [c for c in rw.counts if c.module == module and c.phase == "forward" and _touches(c, h.scores)]
        bwd = [c for c in rw.counts if c.module == module and c.phase == "backward" and _touches(c, h.scores)]
        lse = TensorMeta(-1, h.q.shape[:-1], torch.float32, ())
        args = (h.q, h.k, h.v, None, 0.1 if h.dropout else 0.0, h.causal, None, False)
        f_ev = synthetic(fwd[0].event, torch.ops.nnperf.attention.default, args, [h.q, h.k, h.v], [h.out, lse])
        edits[fwd[0].index] = count_events(rw.trace, [f_ev])
        edits.update({c.index: [] for c in fwd[1:]})
        if bwd:
            grads = [TensorMeta(-2, m.shape, m.dtype, m.stride) for m in (h.q, h.k, h.v)]
            b_args = (h.out, h.q, h.k, h.v, h.out, lse, None, args[4], h.causal, None, False)
            b_ev = synthetic(bwd[0].event, torch.ops.nnperf.attention_backward.default, b_args,
                             [h.out, h.q, h.k, h.v, h.out, lse], grads)
            edits[bwd[0].index] = count_events(rw.trace, [b_ev])
            edits.update({c.index: [] for c in bwd[1:]})
        saved = {m.storage: m.nbytes for c in fwd for m in c.event.outputs
                 if _is_scores(m, h.scores) and "backward" in consumers.get(m.storage, ())}
        rw.memory_delta -= sum(saved.values()) - lse.nbytes
        rw.touched.add(module)
    rw.trace, rw.counts = rebuild(rw.trace, rw.counts, edits)
