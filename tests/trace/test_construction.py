"""Factories may build their model the way user code does (trace.construction): cast it, move
it to CUDA, compile it, and read tensor values while building (timm's drop-path schedule,
``nn.init.trunc_normal_``); the trace follows."""

from __future__ import annotations

import textwrap

import pytest
import torch
from torch import nn

from nnperf.analysis import analyze
from nnperf.errors import ModelLoadError
from nnperf.trace.construction import build_as_user_code, unwrap_compiled

FACTORIES = textwrap.dedent('''
    import torch
    from torch import nn

    class Net(nn.Module):
        """Reads values while building (timm's drop-path rates, trunc_normal_) and ties a weight."""

        def __init__(self):
            super().__init__()
            self.rates = [x.item() for x in torch.linspace(0, 0.1, 3)]
            self.emb = nn.Embedding(100, 16)
            self.lin = nn.Linear(16, 32)
            nn.init.trunc_normal_(self.lin.weight, std=0.02)
            self.out = nn.Linear(32, 16)
            self.head = nn.Linear(16, 100, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, x):
            return self.head(self.out(self.lin(self.emb(x))))

    def tokens(device=None):
        return (torch.randint(0, 100, (4, 8), device=device),)

    def plain():
        return Net(), tokens()

    def cast_bf16():
        return Net().to(torch.bfloat16), tokens()

    def to_cuda():
        return Net().to("cuda"), tokens("cuda")

    def cuda_half():
        return Net().cuda().half(), tokens(torch.device("cuda", 0))

    def compiled():
        return torch.compile(Net()), tokens()

    def compiled_in_place():
        net = Net()
        net.lin = torch.compile(net.lin)
        net.compile()
        return net, tokens()

    def lstm_bf16():
        return nn.LSTM(8, 16, num_layers=2).to(torch.bfloat16), (torch.randn(5, 3, 8).to(torch.bfloat16),)

    def reads_values_in_forward_too():
        class Bad(nn.Module):
            def __init__(self):
                super().__init__()
                self.w = nn.Parameter(torch.ones(3))
                if self.w.sum() > 0:  # a value of a parameter: not there on the meta device either
                    pass
            def forward(self, x):
                return x
        return Bad(), (torch.randn(2, 3),)
''')

#: Net's parameters: embedding 100x16 (tied with the head), 16->32 and 32->16 linears.
NET_PARAMS = 100 * 16 + (16 * 32 + 32) + (32 * 16 + 16)


@pytest.fixture(scope="module")
def factories(tmp_path_factory):
    path = tmp_path_factory.mktemp("factories") / "facs.py"
    path.write_text(FACTORIES)
    return str(path)


def _analyze(factories: str, name: str, **kw):
    return analyze(f"{factories}:{name}", **kw)


def test_plain_factory_reading_values_while_building_traces(factories):
    a = _analyze(factories, "plain")
    assert a.totals["params"] == NET_PARAMS  # the tie survived the meta-parameter rebuild
    assert a.coverage["op_share"] == 1.0


@pytest.mark.parametrize("name,dtype", [("cast_bf16", "bf16"), ("cuda_half", "fp16")])
def test_a_factory_that_casts_its_model_is_traced_in_that_dtype(factories, name, dtype):
    a = _analyze(factories, name)
    assert a.totals["params"] == NET_PARAMS
    assert a.totals["param_bytes"] == NET_PARAMS * 2
    assert a.config["dtype"] == dtype
    # the GEMMs run in the cast dtype (addmm/mm of the linears)
    assert {g.dtype for g in a.gemms} == {dtype}


def test_a_factory_that_moves_to_cuda_traces_on_this_machine(factories):
    ref, moved = _analyze(factories, "plain"), _analyze(factories, "to_cuda")
    assert moved.totals["params"] == NET_PARAMS
    assert moved.totals["flops"] == ref.totals["flops"]


@pytest.mark.parametrize("name", ["compiled", "compiled_in_place"])
def test_a_compiled_model_is_traced_eager_and_says_so(factories, name):
    ref, compiled = _analyze(factories, "plain"), _analyze(factories, name)
    assert compiled.totals["flops"] == ref.totals["flops"]
    assert compiled.totals["params"] == NET_PARAMS
    assert "eager" in compiled.config["torch_compile"]
    assert "torch_compile" not in ref.config
    assert all("_orig_mod" not in r.name for r in compiled.modules())


def test_a_cast_lstm_keeps_its_flat_weights(factories):
    a = _analyze(factories, "lstm_bf16")
    lstm = nn.LSTM(8, 16, num_layers=2)
    assert a.totals["params"] == sum(p.numel() for p in lstm.parameters())
    assert a.totals["param_bytes"] == 2 * a.totals["params"]


def test_reading_a_parameter_value_while_building_is_one_line_with_a_hint(factories):
    with pytest.raises(ModelLoadError, match=r"reads a tensor's value.*--real"):
        _analyze(factories, "reads_values_in_forward_too")


def test_build_as_user_code_without_fake_mode_only_redirects_devices():
    model = build_as_user_code(lambda: nn.Linear(3, 3).to("cuda"))
    assert model.weight.device.type == "cpu"
    x = build_as_user_code(lambda: torch.zeros(2, device="cuda"))
    assert x.device.type == "cpu"


def test_module_conversion_outside_the_build_is_pytorchs_own():
    build_as_user_code(lambda: nn.Linear(2, 2).to(torch.float64))
    m = nn.Linear(2, 2)
    weight = m.weight
    m.to(torch.float64)
    assert m.weight is weight  # Module._apply's set_data path, not the build's rebinding


def test_unwrap_compiled_returns_the_module_it_was_given_when_nothing_is_compiled():
    m = nn.Linear(2, 2)
    assert unwrap_compiled(m) == (m, False)
