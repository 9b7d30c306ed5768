"""``nnperf.analysis.analyze`` on a user's module, and the Analysis exports."""

from __future__ import annotations

import csv
import io
import json

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

from nnperf.analysis import analyze

B, D_IN, D_HID, D_OUT = 4, 8, 16, 4
PARAMS = D_IN * D_HID + D_HID + D_HID * D_OUT + D_OUT


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(D_IN, D_HID), nn.ReLU())
        self.head = nn.Linear(D_HID, D_OUT)
        self.seen: list[tuple[bool, bool]] = []

    def forward(self, x):
        self.seen.append((_stand_in(self.head.weight), _stand_in(x)))
        return self.head(self.body(x))


def _stand_in(t: torch.Tensor) -> bool:
    """A tensor without memory: meta (``trace.meta_world``) or fake."""
    return t.is_meta or isinstance(t, FakeTensor)


def test_real_module_traces_without_its_tensors_and_is_left_untouched():
    model = Net()
    params = dict(model.named_parameters())
    values = {k: v.detach().clone() for k, v in params.items()}
    a = analyze(model, inputs=(torch.randn(B, D_IN),))
    assert model.seen == [(True, True)]  # weights and inputs were stand-ins during the step
    assert dict(model.named_parameters()) == params  # the very same Parameter objects
    for k, p in model.named_parameters():
        assert not isinstance(p, FakeTensor)
        assert torch.equal(p, values[k])
        assert p.grad is None
    assert a.totals["params"] == PARAMS
    assert a.model == "Net"


def test_a_big_model_traces_without_real_memory():
    """A 4 GiB weight would not be traced in time (or at all) if it were ever materialized:
    the module is built on the meta device and only its shapes matter."""
    with torch.device("meta"):
        big = nn.Linear(32768, 32768, bias=False)  # 1.07e9 parameters
    a = analyze(big, inputs=(torch.empty(2, 32768, device="meta"),), train=False)
    assert a.totals["params"] == 32768 * 32768
    assert a.totals["flops"] == 2 * 2 * 32768 * 32768


def test_tied_weights_counted_once():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 8)
            self.head = nn.Linear(8, 10, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, x):
            return self.head(self.emb(x))

    model = Tied()
    a = analyze(model, inputs=(torch.randint(0, 10, (2, 3)),))
    assert a.totals["params"] == 80
    assert a.totals["param_bytes"] == 80 * 4
    assert model.head.weight is model.emb.weight


@pytest.fixture(scope="module")
def small():
    return analyze(Net(), inputs=(torch.randn(B, D_IN),), optimizer="sgd")


def test_to_json_has_the_documented_keys_and_values(small):
    doc = json.loads(json.dumps(small.to_json()))
    expected = {"schema", "model", "config", "totals", "modules", "ops", "gemms", "coverage"}
    assert expected <= set(doc)
    assert doc["schema"] == "nnperf.analysis/1"
    totals = doc["totals"]
    for key in ("params", "param_bytes", "flops", "macs", "bytes", "bytes_in", "bytes_out",
                "bytes_weights", "flops_forward", "flops_backward", "flops_optimizer",
                "bytes_forward", "bytes_backward", "bytes_optimizer", "ops", "gemms"):
        assert key in totals, key
    assert totals["params"] == PARAMS
    assert totals["param_bytes"] == 4 * PARAMS
    gemm_flops = 2 * B * (D_IN * D_HID + D_HID * D_OUT)
    assert totals["flops_forward"] >= gemm_flops
    # backward: grad_weight of both layers, grad_input of the head only
    assert totals["flops_backward"] >= 2 * B * (D_IN * D_HID + 2 * D_HID * D_OUT)
    assert len(doc["gemms"]) == totals["gemms"] == 5
    for g in doc["gemms"]:
        assert {"index", "op", "module", "phase", "role", "m", "n", "k", "batch", "dtype",
                "flops"} <= set(g)
        assert g["flops"] == 2 * g["m"] * g["n"] * g["k"] * g["batch"]
    for row in doc["modules"]:
        assert {"name", "type", "depth", "params", "param_bytes", "output_bytes", "flops",
                "macs", "bytes", "intensity"} <= set(row)
    root = doc["modules"][0]
    assert root["name"] == "" and root["params"] == PARAMS
    assert root["flops"] == pytest.approx(totals["flops"])
    for row in doc["ops"]:
        assert {"op", "count", "flops", "bytes"} <= set(row)
    assert sum(r["count"] for r in doc["ops"]) == totals["ops"]
    assert {"ops", "modeled", "op_share", "byte_share", "uncovered"} <= set(doc["coverage"])
    config = doc["config"]
    assert config["batch"] == B and config["mode"] == "train" and config["optimizer"] == "sgd"
    assert config["inputs"] == [{"shape": [B, D_IN], "dtype": "fp32"}]


def test_modules_depth(small):
    assert [r.name for r in small.modules(0)] == [""]
    depth1 = [r.name for r in small.modules(1)]
    assert depth1[0] == "" and {"body", "head"} <= set(depth1)
    assert "body.0" not in depth1
    rows = {r.name: r for r in small.modules()}
    assert rows["body.0"].params == D_IN * D_HID + D_HID
    assert rows["body"].tally.flops == rows["body.0"].tally.flops + rows["body.1"].tally.flops
    assert rows["head"].output_bytes == B * D_OUT * 4


@pytest.mark.parametrize("by, key", [("module", "name"), ("op", "op"), ("gemm", "role")])
def test_to_csv_parses(small, by, key):
    rows = list(csv.DictReader(io.StringIO(small.to_csv(by=by))))
    assert rows and key in rows[0]
    if by == "gemm":
        assert len(rows) == 5
        assert sorted(r["role"] for r in rows) == sorted(
            ["forward", "forward", "grad_input", "grad_weight", "grad_weight"]
        )
    if by == "module":
        assert rows[0]["name"] == "" and int(rows[0]["params"]) == PARAMS
