"""cuDNN RNN FLOPs (``passes.costs.rnn``) against hand counts and against FlopCounterMode on the
CPU's per-step decomposition of the same layers.

The hand count, per layer l and direction, with N tokens (the sum of the batch at every
timestep), G gates (LSTM 4, GRU 3, RNN 1), hidden H, recurrent width R (the projection size
P of an LSTM with ``proj_size``, else H) and layer input I_l (the input size, then
directions x R):

- forward: input GEMM 2 N G H I_l + recurrent GEMMs 2 N G H R (+ projection 2 N P H);
- backward data: recurrent 2 N R G H (+ projection 2 N H P) + input gradient 2 N I_l G H;
- backward weights: dW_ih 2 G H I_l N + dW_hh 2 G H R N (+ dW_hr 2 P H N);

and the fused pointwise work per hidden unit and token (biases on): LSTM forward 30, backward
24, GRU 23 / 18, tanh RNN 4 / 4, relu RNN 4 / 2, plus the bias gradients, 2 G per unit.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from nnperf.analysis import analyze

GATES = {nn.LSTM: 4, nn.GRU: 3, nn.RNN: 1}
POINTWISE = {  # (forward, backward) per hidden unit and token, with biases
    "lstm": (30, 24), "gru": (23, 18), "rnn_tanh": (4, 4), "rnn_relu": (4, 2),
}


def hand_gemm_flops(cls, input_size, hidden, layers=1, bidirectional=False, proj=0, steps=()):
    g, d, n = GATES[cls], 2 if bidirectional else 1, sum(steps)
    r = proj or hidden
    fwd = bwd = 0
    for layer in range(layers):
        i = input_size if layer == 0 else d * r
        per_dir = 2 * n * g * hidden * i + 2 * n * g * hidden * r + (2 * n * proj * hidden if proj else 0)
        fwd += d * per_dir
        bwd += d * 2 * per_dir  # backward data + backward weights: the same products again, twice
    return fwd, bwd


def hand_pointwise(cell, hidden, layers, bidirectional, steps, gates):
    units = layers * (2 if bidirectional else 1) * sum(steps) * hidden
    fwd, bwd = POINTWISE[cell]
    return units * fwd, units * bwd + units * 2 * gates


class Net(nn.Module):
    def __init__(self, rnn, packed_lengths=None):
        super().__init__()
        self.rnn, self.lengths = rnn, packed_lengths

    def forward(self, x):
        if self.lengths is not None:
            x = nn.utils.rnn.pack_padded_sequence(x, self.lengths, batch_first=self.rnn.batch_first)
            return self.rnn(x)[0].data
        return self.rnn(x)[0]


CASES = [
    # (class, kwargs, cell, input (seq, batch, features) or batch-first, packed lengths)
    (nn.LSTM, {}, "lstm", (7, 3, 10), None),
    (nn.LSTM, {"num_layers": 2, "bidirectional": True}, "lstm", (7, 3, 10), None),
    (nn.LSTM, {"proj_size": 6, "batch_first": True}, "lstm", (3, 7, 10), None),
    (nn.GRU, {"num_layers": 2}, "gru", (7, 3, 10), None),
    (nn.RNN, {"nonlinearity": "relu", "bidirectional": True}, "rnn_relu", (7, 3, 10), None),
    (nn.RNN, {"num_layers": 3}, "rnn_tanh", (7, 3, 10), None),
    (nn.LSTM, {"num_layers": 2}, "lstm", (7, 3, 10), [7, 4, 2]),
]


@pytest.mark.parametrize("cls, kw, cell, shape, lengths", CASES)
def test_rnn_flops_equal_the_hand_count(cls, kw, cell, shape, lengths):
    hidden = 12
    model = Net(cls(10, hidden, **kw), lengths)
    a = analyze(model, inputs=(torch.randn(*shape),), optimizer="sgd")
    seq, batch = (shape[1], shape[0]) if kw.get("batch_first") else (shape[0], shape[1])
    steps = [sum(1 for n in lengths if n > t) for t in range(max(lengths))] if lengths else [batch] * seq
    layers, bi, proj = kw.get("num_layers", 1), kw.get("bidirectional", False), kw.get("proj_size", 0)
    fwd_gemm, bwd_gemm = hand_gemm_flops(cls, 10, hidden, layers, bi, proj, steps)
    fwd_pw, bwd_pw = hand_pointwise(cell, hidden, layers, bi, steps, GATES[cls])
    ops = {c.op: c for c in a.ops if "cudnn_rnn" in c.op}
    assert set(ops) == {"nnperf.cudnn_rnn", "nnperf.cudnn_rnn_backward"}
    assert ops["nnperf.cudnn_rnn"].info["gemm_flops"] == fwd_gemm
    assert ops["nnperf.cudnn_rnn"].flops == fwd_gemm + fwd_pw
    assert ops["nnperf.cudnn_rnn_backward"].info["gemm_flops"] == bwd_gemm
    assert ops["nnperf.cudnn_rnn_backward"].flops == bwd_gemm + bwd_pw
    assert ops["nnperf.cudnn_rnn"].macs == fwd_gemm // 2
    # the lowered GEMMs carry the same FLOPs, with their roles
    rnn_gemms = [g for g in a.gemms if "cudnn_rnn" in g.op]
    assert sum(g.flops for g in rnn_gemms) == fwd_gemm + bwd_gemm
    assert {g.role for g in rnn_gemms} == {"forward", "grad_input", "grad_weight"}
    assert a.coverage["uncovered"] == []


def test_first_layer_input_gradient_is_counted_as_cudnn_computes_it():
    """cuDNN's backward data always computes dx ("because it mutates reserve"): the count
    does not depend on whether the input wants a gradient."""
    x = torch.randn(5, 2, 8)
    a = analyze(Net(nn.GRU(8, 16)), inputs=(x,), optimizer="sgd")
    bwd = next(c for c in a.ops if c.op == "nnperf.cudnn_rnn_backward")
    n, g, h = 10, 3, 16
    assert 2 * n * 8 * g * h in [2 * gm.m * gm.n * gm.k for gm in bwd.gemms]  # dx: M=N, N=I, K=GH


@pytest.mark.parametrize("cls, kw", [
    (nn.LSTM, {"num_layers": 2, "bidirectional": True}),
    (nn.LSTM, {"proj_size": 5}),
    (nn.GRU, {"num_layers": 2, "bidirectional": True}),
    (nn.RNN, {"num_layers": 2}),
])
def test_gemm_flops_equal_flop_counter_on_the_cpu_decomposition(cls, kw):
    """FlopCounterMode counts the per-step ``addmm``/``mm`` of the CPU implementation (oneDNN
    off, so LSTM decomposes too) forward and backward: the same GEMM work as cuDNN's when the
    input and the initial states want gradients (cuDNN computes dx and dhx always)."""
    torch.manual_seed(0)
    rnn = cls(6, 8, **kw)
    x = torch.randn(5, 3, 6, requires_grad=True)
    layers, d = kw.get("num_layers", 1), 2 if kw.get("bidirectional") else 1
    h0 = torch.zeros(layers * d, 3, kw.get("proj_size") or 8, requires_grad=True)
    state = (h0, torch.zeros(layers * d, 3, 8, requires_grad=True)) if cls is nn.LSTM else h0
    onednn = torch._C._get_mkldnn_enabled()
    torch._C._set_mkldnn_enabled(False)
    try:
        with FlopCounterMode(display=False) as counter:
            rnn(x, state)[0].sum().backward()
    finally:
        torch._C._set_mkldnn_enabled(onednn)
    expected = counter.get_total_flops()
    a = analyze(Net(rnn), inputs=(x.detach(),), optimizer="sgd")
    counted = sum(g.flops for g in a.gemms if "cudnn_rnn" in g.op)
    assert counted == expected > 0
