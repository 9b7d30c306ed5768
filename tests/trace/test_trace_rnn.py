"""Recurrent layers trace as the cuDNN RNN CUDA runs (``trace.rnn``), packed sequences keep
their host lengths (``trace.packing``), and no RNN op is left uncovered."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch import nn

from nnperf.analysis import analyze
from nnperf.trace.packing import UNKNOWN_LENGTHS


class Net(nn.Module):
    def __init__(self, rnn):
        super().__init__()
        self.rnn = rnn

    def forward(self, x):
        return self.rnn(x)[0]


def _ops(a) -> Counter:
    return Counter(e.name for e in a.trace.events)


@pytest.mark.parametrize("rnn", [
    nn.LSTM(8, 16, num_layers=2, bidirectional=True),
    nn.LSTM(8, 16, proj_size=4, batch_first=True),
    nn.GRU(8, 16, num_layers=2),
    nn.RNN(8, 16, nonlinearity="relu"),
])
def test_training_step_runs_cudnns_rnn_and_leaves_nothing_uncovered(rnn):
    a = analyze(Net(rnn), inputs=(torch.randn(5, 3, 8),))
    ops = _ops(a)
    assert ops["nnperf.cudnn_rnn"] == 1 and ops["nnperf.cudnn_rnn_backward"] == 1
    assert not [name for name in ops if "mkldnn" in name or name in ("aten.addmm", "aten.mm")]
    assert a.coverage["uncovered"] == []
    # every parameter gets its gradient from the one backward op
    assert sum(p.numel() for p in rnn.parameters()) == a.totals["params"]


def test_inference_has_no_reserve_and_no_backward():
    a = analyze(Net(nn.LSTM(8, 16)), inputs=(torch.randn(5, 3, 8),), train=False)
    fwd = [e for e in a.trace.events if e.name == "nnperf.cudnn_rnn"]
    assert len(fwd) == 1 and "nnperf.cudnn_rnn_backward" not in _ops(a)
    assert fwd[0].outputs[-1].numel == 0  # reserve


def test_training_reserve_holds_what_backward_reads():
    """Per layer, direction and token: the gate activations (4H), the cell state (H); plus the
    first layer's output for the second (directions x H), in the input's element size."""
    a = analyze(Net(nn.LSTM(8, 16, num_layers=2, bidirectional=True)), inputs=(torch.randn(5, 3, 8),))
    fwd = next(e for e in a.trace.events if e.name == "nnperf.cudnn_rnn")
    tokens, h = 15, 16
    elements = 2 * 2 * tokens * (4 * h + h) + 1 * tokens * 2 * h
    assert fwd.outputs[-1].nbytes == elements * 4
    bwd = next(e for e in a.trace.events if e.name == "nnperf.cudnn_rnn_backward")
    assert fwd.outputs[-1].storage in {t.storage for t in bwd.inputs}


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_autocast_runs_cudnn_rnns_in_fp16_whatever_the_autocast_dtype(amp):
    """``_cudnn_rnn_cast_reflatten`` (aten/src/ATen/cudnn/AutocastRNN.cpp) casts input, states
    and weights with ``at::kHalf``."""
    a = analyze(Net(nn.GRU(8, 16)), inputs=(torch.randn(5, 3, 8),), amp=amp)
    fwd = next(e for e in a.trace.events if e.name == "nnperf.cudnn_rnn")
    assert {t.dtype for t in fwd.inputs} == {torch.float16}
    assert {g.dtype for g in a.gemms if "cudnn_rnn" in g.op} == {"fp16"}


class Packed(nn.Module):
    def __init__(self, lengths=None, enforce_sorted=True):
        super().__init__()
        self.rnn = nn.LSTM(8, 16, batch_first=True)
        self.lengths, self.enforce_sorted = lengths, enforce_sorted

    def forward(self, x, lengths=None):
        lengths = self.lengths if lengths is None else lengths
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True,
                                                   enforce_sorted=self.enforce_sorted)
        out, _ = self.rnn(packed)
        return nn.utils.rnn.pad_packed_sequence(out, batch_first=True)[0]


@pytest.mark.parametrize("model, inputs", [
    (Packed([6, 4, 1]), (torch.randn(3, 6, 8),)),
    (Packed(enforce_sorted=False), (torch.randn(3, 6, 8), torch.tensor([4, 6, 1]))),
])
def test_packed_sequences_trace_on_fake_tensors_as_on_real_ones(model, inputs):
    fake = analyze(model, inputs=inputs, optimizer="sgd")
    real = analyze(model, inputs=inputs, optimizer="sgd", real=True)
    assert fake.coverage["uncovered"] == [] and real.coverage["uncovered"] == []
    shapes = lambda a: [(g.m, g.n, g.k, g.role) for g in a.gemms]  # noqa: E731
    assert shapes(fake) == shapes(real)
    fwd = next(e for e in fake.trace.events if e.name == "nnperf.cudnn_rnn")
    assert fwd.args[-1] == [3, 2, 2, 2, 1, 1]  # batch_sizes: sequences still running per step
    assert "assumptions" not in fake.config
    # reading the host's batch sizes (nn.LSTM's int(batch_sizes[0])) is no device sync
    reads = [e for e in fake.trace.events if e.name == "aten._local_scalar_dense" and e.phase == "forward"]
    assert reads and all(e.free for e in reads)


class DeviceLengths(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(8, 16)

    def forward(self, x, mask):
        lengths = mask.sum(0).cpu()  # computed from a device tensor: unknown to a fake trace
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
        return self.rnn(packed)[0].data


def test_unknown_lengths_are_an_explicit_full_length_assumption():
    a = analyze(DeviceLengths(), inputs=(torch.randn(6, 3, 8), torch.ones(6, 3)))
    assert a.config["assumptions"] == [UNKNOWN_LENGTHS]
    fwd = next(e for e in a.trace.events if e.name == "nnperf.cudnn_rnn")
    assert fwd.args[-1] == [3] * 6
