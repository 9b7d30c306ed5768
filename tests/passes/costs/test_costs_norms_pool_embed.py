"""Norms, pooling, embedding, softmax and losses: FLOPs and bytes worked out from the shapes."""

from __future__ import annotations

import torch
from torch import nn

from nnperf.passes.costs import lookup
from nnperf.trace.capture import trace_workload
from nnperf.trace.events import OpEvent, TensorMeta
from nnperf.trace.options import TraceOptions
from nnperf.workload import Workload

B, T, D, V = 2, 5, 8, 11


def trace(model, *inputs, train=True):
    options = TraceOptions(train=train, optimizer="none")
    tr, _ = trace_workload(lambda: Workload(model, tuple(inputs)), options)
    return tr.events


def cost_of(evs, name):
    found = [e for e in evs if e.name == name]
    assert len(found) == 1, name
    return lookup(found[0])(found[0])


def nbytes(metas):
    return sum(t.nbytes for t in metas)


def test_layer_norm_forward_reads_input_and_affine_writes_output_and_stats():
    c = cost_of(trace(nn.LayerNorm(D), torch.randn(B, T, D), train=False), "aten.native_layer_norm")
    f32 = 4
    assert nbytes(c.reads) == (B * T * D + 2 * D) * f32  # x, weight, bias
    assert nbytes(c.writes) == (B * T * D + 2 * B * T) * f32  # y, mean and rstd per row
    assert c.flops == B * T * D * (6 + 2)


def test_layer_norm_backward_writes_three_gradients():
    c = cost_of(
        trace(nn.LayerNorm(D), torch.randn(B, T, D, requires_grad=True)),
        "aten.native_layer_norm_backward",
    )
    assert sum(t.numel for t in c.writes) == B * T * D + 2 * D
    # grad_out is the sum loss's expanded scalar: 1 element; then x, mean, rstd, weight
    assert sum(t.numel for t in c.reads) == 1 + B * T * D + 2 * B * T + D


def test_batch_norm_training_updates_running_stats():
    C, H = 4, 6
    c = cost_of(trace(nn.BatchNorm2d(C), torch.randn(B, C, H, H)), "aten.native_batch_norm")
    n = B * C * H * H
    assert c.flops == n * (5 + 2)
    assert sum(t.numel for t in c.reads) == n + 2 * C + 2 * C  # x, w, b, running mean/var
    assert sum(t.numel for t in c.writes) == n + 2 * C + 2 * C  # y, save stats, running stats


def meta(storage, shape, dtype=torch.float32):
    stride = tuple(int(s) for s in torch.empty(shape, device="meta").stride())
    return TensorMeta(storage, tuple(shape), dtype, stride)


def test_fused_rms_norm_event_built_by_hand():
    """On CPU ``_fused_rms_norm`` decomposes, so the CUDA op is built by hand."""
    x, w = meta(0, (B, T, D)), meta(1, (D,))
    out, rstd = meta(2, (B, T, D)), meta(3, (B, T, 1))
    event = OpEvent(
        index=0,
        func=torch.ops.aten._fused_rms_norm.default,
        args=(x, [D], w, 1e-6),
        kwargs={},
        inputs=[x, w],
        outputs=[out, rstd],
        phase="forward",
        module="",
    )
    c = lookup(event)(event)
    assert c.flops == B * T * D * 4  # square, sum, scale, weight
    assert sum(t.numel for t in c.reads) == B * T * D + D
    assert sum(t.numel for t in c.writes) == B * T * D + B * T


def test_embedding_gathers_rows_and_backward_writes_the_whole_table():
    evs = trace(nn.Embedding(V, D), torch.randint(0, V, (B, T)))
    fwd = cost_of(evs, "aten.embedding")
    # indices (int64) plus the B*T selected rows, not the V-row table
    assert nbytes(fwd.reads) == B * T * 8 + B * T * D * 4
    assert nbytes(fwd.writes) == B * T * D * 4
    bwd = cost_of(evs, "aten.embedding_dense_backward")
    assert sum(t.numel for t in bwd.writes) == V * D  # dense grad_weight
    assert bwd.flops == B * T * D  # one add per grad_output element
    assert bwd.info["scatter_add"]


def test_max_pool_forward_and_backward():
    C, H = 3, 8
    evs = trace(nn.MaxPool2d(2), torch.randn(B, C, H, H, requires_grad=True))
    fwd = cost_of(evs, "aten.max_pool2d_with_indices")
    out = B * C * (H // 2) ** 2
    assert fwd.flops == out * 4  # 2x2 window comparisons
    assert nbytes(fwd.reads) == B * C * H * H * 4
    assert nbytes(fwd.writes) == out * 4 + out * 8  # values + int64 indices
    bwd = cost_of(evs, "aten.max_pool2d_with_indices_backward")
    assert sum(t.numel for t in bwd.writes) == B * C * H * H
    assert bwd.flops == out


def test_adaptive_avg_pool_with_uneven_windows():
    # 5 -> 3: windows [0,2), [1,4), [3,5) = 2 + 3 + 2 = 7 per dimension
    c = cost_of(
        trace(nn.AdaptiveAvgPool2d(3), torch.randn(1, 2, 5, 5), train=False),
        "aten._adaptive_avg_pool2d",
    )
    assert c.flops == 2 * 7 * 7


def test_cross_entropy_pieces():
    class CE(nn.Module):
        def forward(self, x):
            return nn.functional.cross_entropy(x, torch.zeros(B, dtype=torch.long))

    evs = trace(CE(), torch.randn(B, V, requires_grad=True))
    sm = cost_of(evs, "aten._log_softmax")
    assert sm.flops == 5 * B * V
    nll = cost_of(evs, "aten.nll_loss_forward")
    # targets (int64) plus one gathered log-probability per target
    assert nbytes(nll.reads) == B * 8 + B * 4
    nll_b = cost_of(evs, "aten.nll_loss_backward")
    assert sum(t.numel for t in nll_b.writes) == B * V


# --- the second sweep PyTorch's CUDA normalization kernels make (norms.second_reads) ---


class _Squared(nn.Module):
    """norm(x) ** 2: the norm's backward gets a whole output gradient (a bare module's summed
    output would hand it one broadcast element)."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.norm = norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(x)
        return y * y


def _second(evs, name):
    from nnperf.passes.costs.norms import second_reads

    found = [e for e in evs if e.name == name]
    assert len(found) == 1, name
    return [tuple(t.shape) for t in second_reads(found[0])]


def test_batch_norm_training_reads_its_input_again_and_backward_reads_both_again():
    C, H = 4, 6
    evs = trace(_Squared(nn.BatchNorm2d(C)), torch.randn(B, C, H, H, requires_grad=True))
    assert _second(evs, "aten.native_batch_norm") == [(B, C, H, H)]  # statistics, then normalize
    assert _second(evs, "aten.native_batch_norm_backward") == [(B, C, H, H), (B, C, H, H)]  # dy, x


def test_batch_norm_without_an_input_gradient_sweeps_once_backward():
    C, H = 4, 6
    evs = trace(_Squared(nn.BatchNorm2d(C)), torch.randn(B, C, H, H))  # the first layer's input
    assert _second(evs, "aten.native_batch_norm_backward") == []


def test_batch_norm_in_evaluation_sweeps_once():
    C, H = 4, 6
    evs = trace(nn.BatchNorm2d(C).eval(), torch.randn(B, C, H, H), train=False)
    bn = [e for e in evs if "batch_norm" in e.name]
    assert bn and all(_second(evs, e.name) == [] for e in bn)


def test_layer_norm_forward_sweeps_once_and_backward_rereads_for_the_affine_gradients():
    evs = trace(_Squared(nn.LayerNorm(D)), torch.randn(B, T, D, requires_grad=True))
    assert _second(evs, "aten.native_layer_norm") == []  # a row stays in registers
    assert _second(evs, "aten.native_layer_norm_backward") == [(B, T, D), (B, T, D)]  # gamma/beta kernel


def test_layer_norm_without_affine_has_only_the_row_local_input_gradient():
    evs = trace(_Squared(nn.LayerNorm(D, elementwise_affine=False)), torch.randn(B, T, D, requires_grad=True))
    assert _second(evs, "aten.native_layer_norm_backward") == []


def test_group_norm_reads_its_input_again_both_ways():
    C, H = 4, 6
    evs = trace(_Squared(nn.GroupNorm(2, C)), torch.randn(B, C, H, H, requires_grad=True))
    assert _second(evs, "aten.native_group_norm") == [(B, C, H, H)]
    assert _second(evs, "aten.native_group_norm_backward") == [(B, C, H, H), (B, C, H, H)]
