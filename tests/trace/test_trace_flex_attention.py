"""FlexAttention is traced as one op forward and one backward, with the pairs its block mask
keeps and the pairs of the blocks its kernel computes, each worked out by hand here; a dense
call's FLOPs equal PyTorch's FlopCounterMode's."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from torch.utils.flop_counter import sdpa_flop_count

from nnperf.analysis import analyze
from nnperf.trace.flex_attention import MASK_UNKNOWN

B, H, D = 2, 2, 16
BLOCK = 128  # the BlockMask's default block size


def causal(b, h, q, kv):
    return q >= kv


def sliding_window(b, h, q, kv):
    return (q >= kv) & (q - kv <= 64)


class FlexBlock(nn.Module):
    """A projection (a parameter, so a backward) and one flex_attention call under ``mask_mod``
    (None: no block mask), or under document ids read from the input (``documents``)."""

    def __init__(self, mask_mod=None, documents=False, compiled=False, kv_heads=H):
        super().__init__()
        self.proj = nn.Linear(D * H, 3 * D * H)
        self.mask_mod, self.documents, self.kv_heads = mask_mod, documents, kv_heads
        self.flex = torch.compile(flex_attention) if compiled else flex_attention

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.proj(x).view(b, s, 3, H, D).permute(2, 0, 3, 1, 4)
        k, v = k[:, : self.kv_heads], v[:, : self.kv_heads]
        mask = None
        if self.documents:
            ids = (x[0, :, 0] > 1.0).cumsum(0)  # a new document after each large value

            def same_document(b, h, qi, ki):
                return (qi >= ki) & (ids[qi] == ids[ki])

            mask = create_block_mask(same_document, None, None, s, s, device=x.device)
        elif self.mask_mod is not None:
            mask = create_block_mask(self.mask_mod, None, None, s, s, device=x.device)
        return self.flex(q, k, v, block_mask=mask, enable_gqa=self.kv_heads != H).sum()


def _flex_ops(model, seq, **options):
    a = analyze(model, inputs=torch.randn(B, seq, D * H), loss_fn=lambda out: out, optimizer="sgd", **options)
    return a, [o for o in a.ops if o.category == "attention"]


def test_flex_attention_is_one_op_forward_and_one_backward():
    _, ops = _flex_ops(FlexBlock(causal), 256)
    assert [(o.op, o.phase) for o in ops] == [
        ("higher_order.flex_attention", "forward"),
        ("higher_order.flex_attention_backward", "backward"),
    ]
    fwd, _ = ops
    # reads q, k, v and the mask's block tensors (2 x 2 blocks: four int32 counts of 2 rows and
    # four int32 index tables of 2 x 2); writes the output and two fp32 row statistics
    # (log-sum-exp and the row maxima PyTorch's op returns)
    qkv = 3 * B * H * 256 * D * 4
    assert fwd.bytes_in == qkv + 4 * 2 * 4 + 4 * 4 * 4
    assert fwd.bytes_out == B * H * 256 * D * 4 + 2 * B * H * 256 * 4


def test_the_autograd_rule_bookkeeping_is_not_recorded():
    """Training runs the op's autograd rule, which makes example scalars and traces the
    score_mod's backward on the host: no kernel of the step. The forward before the attention
    records the same ops as an inference forward does."""
    def ops_before_attention(train):
        a = analyze(FlexBlock(causal), inputs=torch.randn(B, 256, D * H), loss_fn=lambda out: out,
                    optimizer="sgd", train=train)
        names = [e.name for e in a.trace.events]
        return names[: names.index("higher_order.flex_attention")]

    assert ops_before_attention(True) == ops_before_attention(False)


def test_causal_mask_counts_kept_pairs_and_computed_blocks():
    seq = 256  # two blocks each way: the two diagonal blocks and the one below them are computed
    _, (fwd, bwd) = _flex_ops(FlexBlock(causal), seq)
    kept = B * H * seq * (seq + 1) // 2
    executed = B * H * 3 * BLOCK * BLOCK
    assert fwd.flops == 2 * kept * (D + D)  # Q@K^T and P@V
    assert fwd.info["executed_flops"] == 2 * executed * (D + D)
    assert bwd.flops == 2 * fwd.flops  # dV, dP, dQ, dK
    assert bwd.info["executed_flops"] == 2 * fwd.info["executed_flops"]
    assert bwd.info["recompute_flops"] == 2 * executed * D  # Q@K^T again


def test_sliding_window_skips_the_blocks_outside_it():
    """A 64-token window over 384 tokens: row i keeps min(i, 64) + 1 keys; the kernel computes
    the 3 diagonal blocks and the 2 just below them (their corner pairs are 1 apart), none
    further (at least 129 apart)."""
    seq = 384
    _, (fwd, _) = _flex_ops(FlexBlock(sliding_window), seq)
    kept = B * H * sum(min(i, 64) + 1 for i in range(seq))
    assert fwd.info["kept_pairs"] == kept
    assert fwd.info["executed_pairs"] == B * H * 5 * BLOCK * BLOCK


def test_a_sequence_off_the_block_size_counts_the_cut_blocks_by_their_size():
    seq = 200  # blocks of 128 and 72 rows (and columns)
    _, (fwd, _) = _flex_ops(FlexBlock(causal), seq)
    assert fwd.info["kept_pairs"] == B * H * seq * (seq + 1) // 2
    assert fwd.info["executed_pairs"] == B * H * (128 * 128 + 72 * 128 + 72 * 72)


def test_grouped_query_heads_count_the_query_heads():
    _, (fwd, _) = _flex_ops(FlexBlock(causal, kv_heads=1), 256)
    assert fwd.info["kept_pairs"] == B * H * 256 * 257 // 2


def test_without_a_mask_every_pair_counts_as_flop_counter_counts_it():
    """FlopCounterMode's formula for the flex op (``torch.utils.flop_counter``, registered for
    ``flex_attention``: SDPA's dense count) on the call's shapes."""
    seq = 128
    _, (fwd, bwd) = _flex_ops(FlexBlock(), seq)
    shape = (B, H, seq, D)
    assert fwd.flops == sdpa_flop_count(shape, shape, shape)
    assert fwd.info["executed_flops"] == fwd.flops
    assert bwd.flops == 2 * fwd.flops


def test_a_compiled_flex_attention_traces_as_the_plain_one():
    """torchtitan calls ``torch.compile(flex_attention)``: the same two ops and counts."""
    _, plain = _flex_ops(FlexBlock(causal), 256)
    _, compiled = _flex_ops(FlexBlock(causal, compiled=True), 256)
    assert [(o.op, o.flops, o.info["executed_flops"]) for o in compiled] == [
        (o.op, o.flops, o.info["executed_flops"]) for o in plain]


def test_a_mask_of_the_batch_values_is_dense_and_said_so():
    """Document ids from the batch are fakes in the trace: the mask cannot be evaluated, so
    every pair counts (the upper bound) and the trace says why."""
    seq = 256
    a, (fwd, _) = _flex_ops(FlexBlock(documents=True), seq)
    assert fwd.info["kept_pairs"] == fwd.info["executed_pairs"] == B * H * seq * seq
    assert MASK_UNKNOWN in a.trace.config["assumptions"]


def test_a_mask_of_the_batch_values_is_counted_on_real_tensors():
    """With real tensors (--real) the documents are known: two documents split at token 100
    keep 100*101/2 + 156*157/2 pairs per head; the blocks computed are the causal ones the two
    documents touch: all three of a causal 256-token mask (document 2 spans both blocks)."""
    seq = 256
    x = torch.zeros(B, seq, D * H)
    x[0, 100, 0] = 2.0  # document 2 starts at token 100
    a = analyze(FlexBlock(documents=True), inputs=x, loss_fn=lambda out: out, optimizer="sgd", real=True)
    fwd = next(o for o in a.ops if o.op == "higher_order.flex_attention")
    assert fwd.info["kept_pairs"] == B * H * (100 * 101 // 2 + 156 * 157 // 2)
    assert fwd.info["executed_pairs"] == B * H * 3 * BLOCK * BLOCK


@pytest.mark.parametrize("attention", ["sdpa", "flex"])
def test_zoo_decoders_attend_causally_either_way(attention):
    """The zoo's Llama with attention=flex keeps the same pairs as its causal SDPA."""
    a = analyze("llama-7b", n_layer=1, dim=64, n_heads=4, ffn_hidden=96, vocab=64, seq_len=256,
                attention=attention)
    fwd = next(o for o in a.ops if o.category == "attention" and o.phase == "forward")
    assert fwd.flops == 2 * 1 * 4 * (256 * 257 // 2) * (16 + 16)


def test_zoo_document_length_masks_each_document():
    """doc_len=64 over 256 tokens: 4 documents of 64 tokens, each causal within itself; the
    kernel computes the two diagonal 128-blocks only (a block below the diagonal holds no pair
    of one document)."""
    a = analyze("llama-7b", n_layer=1, dim=64, n_heads=4, ffn_hidden=96, vocab=64, seq_len=256,
                attention="flex", doc_len=64)
    fwd = next(o for o in a.ops if o.op == "higher_order.flex_attention")
    assert fwd.info["kept_pairs"] == 4 * 4 * (64 * 65 // 2)
    assert fwd.info["executed_pairs"] == 4 * 2 * BLOCK * BLOCK


@pytest.mark.parametrize("layout", [dict(tensor=2), dict(pipeline=2, micro_batch=1, grad_accum=2,
                                                         pipeline_schedule="1f1b")], ids=["tp", "pp"])
def test_a_rank_of_a_parallel_layout_attends_with_its_share(layout):
    """Tensor parallelism splits the heads (2 of 4 per rank); a pipeline stage runs its own
    layer's attention for each of its micro-batches (the compiled flex_attention runs eagerly,
    also where the stage's shapes are inferred outside the recorder)."""
    from nnperf.layout import Execution
    from nnperf.trace.blocks import repeated_blocks
    from nnperf.trace.distributed import trace_rank
    from nnperf.trace.options import TraceOptions
    from nnperf.zoo import get_model

    def build():
        return get_model("llama-7b").build(batch=2, seq_len=256, n_layer=2, dim=64, n_heads=4, n_kv_heads=2,
                                           ffn_hidden=96, vocab=64, attention="flex")

    events = trace_rank(build, TraceOptions(), Execution(world=2, **layout), repeated_blocks, None).trace.events
    forwards = [e for e in events if e.name == "higher_order.flex_attention"]
    heads, batch, calls = (2, 2, 2) if "tensor" in layout else (4, 1, 2)  # 2 layers; 1 layer x 2 micro-batches
    assert len(forwards) == calls
    assert all(e.values["kept_pairs"] == (batch * heads * 256 * 257 // 2,) for e in forwards)


def test_a_block_mask_of_listed_blocks_counts_them():
    """``BlockMask.from_kv_blocks`` with no mask_mod, built from real block tables outside the
    step: every pair of each listed block is kept and computed. Over 256 tokens each query
    block lists key block 0 only: 2 blocks of 128 x 128 per batch row and head."""
    from torch.nn.attention.flex_attention import BlockMask

    class Listed(FlexBlock):
        def __init__(self):
            super().__init__()
            self.listed = BlockMask.from_kv_blocks(torch.ones(1, 1, 2, dtype=torch.int32),
                                                   torch.zeros(1, 1, 2, 2, dtype=torch.int32))

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.proj(x).view(b, s, 3, H, D).permute(2, 0, 3, 1, 4)
            return flex_attention(q, k, v, block_mask=self.listed).sum()

    _, (fwd, _) = _flex_ops(Listed(), 256)
    assert fwd.info["kept_pairs"] == fwd.info["executed_pairs"] == B * H * 2 * BLOCK * BLOCK
