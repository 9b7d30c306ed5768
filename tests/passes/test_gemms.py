"""GEMM lowering: an n-layer MLP training step is 3n-1 GEMMs with the right shapes and roles;
convolutions lower to implicit GEMMs."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch import nn

from nnperf.analysis import analyze


@pytest.mark.parametrize("widths", [[8, 4], [8, 16, 4], [8, 16, 32, 12, 4]])
def test_mlp_training_step_is_3n_minus_1_gemms(widths):
    n, batch = len(widths) - 1, 6
    a = analyze("mlp", batch=batch, widths=",".join(map(str, widths)), optimizer="sgd")
    assert len(a.gemms) == 3 * n - 1
    roles = Counter(g.role for g in a.gemms)
    assert roles == Counter({"forward": n, "grad_input": n - 1, "grad_weight": n})
    layer_modules = [str(2 * i) for i in range(n)]  # Sequential: Linear, ReLU, Linear, ...
    by_module = {m: sorted(g.role for g in a.gemms if g.module == m) for m in layer_modules}
    assert by_module[layer_modules[0]] == ["forward", "grad_weight"]  # no grad_input
    for m in layer_modules[1:]:
        assert by_module[m] == ["forward", "grad_input", "grad_weight"]
    # shapes (M, N, K): forward (B, out, in); grad_input (B, in, out); grad_weight has the
    # weight's shape, either orientation, reducing over the batch; FLOPs always 2*B*in*out
    for i, m in enumerate(layer_modules):
        k_in, n_out = widths[i], widths[i + 1]
        for g in (g for g in a.gemms if g.module == m):
            assert g.flops == 2 * batch * k_in * n_out
            if g.role == "forward":
                assert (g.m, g.n, g.k, g.phase) == (batch, n_out, k_in, "forward")
            elif g.role == "grad_input":
                assert (g.m, g.n, g.k, g.phase) == (batch, k_in, n_out, "backward")
            else:
                assert {g.m, g.n} == {k_in, n_out} and g.k == batch and g.phase == "backward"


def test_mlp_inference_is_n_forward_gemms():
    a = analyze("mlp", batch=3, widths="8,16,4", train=False)
    assert [(g.role, g.m, g.n, g.k) for g in a.gemms] == [
        ("forward", 3, 16, 8),
        ("forward", 3, 4, 16),
    ]


def test_batch_one_is_a_matrix_vector_product():
    a = analyze("mlp", batch=1, widths="8,16", train=False)
    (g,) = a.gemms
    assert (g.m, g.n, g.k) == (1, 16, 8)


def test_gemm_flops_equal_counted_gemm_and_conv_flops():
    a = analyze("mnist-cnn", batch=2, optimizer="sgd")
    counted = sum(o.flops for o in a.ops if o.category in ("gemm", "conv"))
    assert sum(g.flops for g in a.gemms) == counted > 0


def test_grouped_convolution_lowers_to_implicit_gemm_per_group():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 8, 3)  # first layer: no grad_input
            self.grouped = nn.Conv2d(8, 12, 3, stride=2, padding=1, groups=4)

        def forward(self, x):
            return self.grouped(self.stem(x))

    n, h = 2, 11
    a = analyze(Net(), inputs=(torch.randn(n, 3, h, h),), optimizer="sgd")
    stem = sorted((g.role, g.m, g.n, g.k, g.batch) for g in a.gemms if g.module == "stem")
    p = h - 2  # 9x9 output
    assert stem == [
        ("forward", n * p * p, 8, 3 * 9, 1),
        ("grad_weight", 8, 3 * 9, n * p * p, 1),
    ]
    grouped = sorted((g.role, g.m, g.n, g.k, g.batch) for g in a.gemms if g.module == "grouped")
    q = (p + 2 - 3) // 2 + 1  # 5x5 output
    cin_g, cout_g = 8 // 4, 12 // 4
    assert grouped == [
        ("forward", n * q * q, cout_g, cin_g * 9, 4),
        ("grad_input", n * q * q, cin_g * 9, cout_g, 4),
        ("grad_weight", cout_g, cin_g * 9, n * q * q, 4),
    ]


def test_bmm_without_weights_in_backward_is_plain_backward():
    class Scores(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            y = self.fc(x)
            return torch.bmm(y, y.transpose(1, 2))

    a = analyze(Scores(), inputs=(torch.randn(3, 5, 4),), optimizer="sgd")
    bmm = [g for g in a.gemms if g.op == "aten.bmm"]
    assert [(g.phase, g.role) for g in bmm] == [
        ("forward", "forward"), ("backward", "backward"), ("backward", "backward"),
    ]
    # forward (5x4)@(4x5); backward dA = G@B^T (5x5)@(5x4), dB = A^T@G (4x5)@(5x5); batch 3
    assert sorted((g.m, g.n, g.k, g.batch) for g in bmm) == [(4, 5, 5, 3), (5, 4, 5, 3), (5, 5, 4, 3)]


@pytest.mark.parametrize("precision", [{"amp": "bf16"}, {"dtype": "bf16"}])
def test_roles_survive_low_precision(precision):
    """Under autocast the backward reads bf16 copies of the weights: still grad_input."""
    a = analyze("mlp", batch=4, widths="8,16,16,4", optimizer="sgd", **precision)
    assert Counter(g.role for g in a.gemms) == Counter(
        {"forward": 3, "grad_input": 2, "grad_weight": 3}
    )
    assert {g.dtype for g in a.gemms} == {"bf16"}


@pytest.mark.parametrize("data", ["zero1", "fsdp"])
def test_a_data_parallel_ranks_backward_gemms_keep_their_roles(data):
    """Every linear of a traced Llama rank has one input-gradient and one weight-gradient GEMM in
    backward (the first, wq/wk/wv, too: the embedding's output needs its gradient), under DDP's
    ZeRO-1 and under FSDP2 alike. Under FSDP2 the GEMMs read the gathered weight (its copy-out's
    storage, not the shard the module holds) and the weight gradient has the gathered shape."""
    from nnperf.analysis import Analysis
    from nnperf.layout import Execution
    from nnperf.trace.blocks import repeated_blocks
    from nnperf.trace.distributed import trace_rank
    from nnperf.trace.options import TraceOptions
    from nnperf.zoo.llama import build

    dim, ffn, layers = 64, 96, 2
    options = TraceOptions(optimizer="adamw", dtype="bf16")
    execution = Execution(world=4, data=data, shard=4 if data == "fsdp" else 1)
    traced = trace_rank(lambda: build(2, 16, n_layer=layers, dim=dim, n_heads=4, n_kv_heads=4, ffn_hidden=ffn,
                                      vocab=128), options, execution, repeated_blocks)
    gemms = Analysis.from_trace("llama", options, traced.trace, traced.workload).gemms
    linears = {"attention.wq", "attention.wk", "attention.wv", "attention.wo", "feed_forward.w1", "feed_forward.w2",
               "feed_forward.w3"}
    in_blocks = [g for g in gemms if g.phase == "backward" and g.module.removeprefix("module.").split(".", 2)[-1]
                 in linears]
    assert Counter(g.role for g in in_blocks) == Counter({"grad_input": 7 * layers, "grad_weight": 7 * layers})
    w2 = {(g.m, g.n) for g in in_blocks if g.role == "grad_weight" and g.module.endswith("w2")}
    assert w2 <= {(dim, ffn), (ffn, dim)}  # the whole weight's gradient, not a shard's
