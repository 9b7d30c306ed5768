"""The recorder's fast path over op arguments records exactly what ``tree_map`` would: the
same trace, op for op, with it and with every op forced through the general path."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map

from nnperf.trace import recorder
from nnperf.trace.capture import trace_workload
from nnperf.trace.events import Trace
from nnperf.trace.options import TraceOptions
from nnperf.workload import Workload


def _trace(**options) -> Trace:
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                          nn.Linear(8 * 6 * 6, 10))
    tr, _ = trace_workload(lambda: Workload(model, (torch.randn(2, 3, 8, 8),)),
                           TraceOptions(**options))
    return tr


def _events(tr: Trace) -> list[tuple]:
    return [(e.name, e.args, e.kwargs, e.inputs, e.outputs, e.phase, e.module, e.free,
             e.allocates, sorted(e.releases)) for e in tr.events]


@pytest.mark.parametrize("options", [{}, {"amp": "bf16"}, {"optimizer_impl": "single"}])
def test_fast_path_records_what_tree_map_records(monkeypatch, options):
    fast = _trace(**options)

    def general_only(x, fn, found):
        raise recorder._NotPlain

    monkeypatch.setattr(recorder, "_map_plain", general_only)
    general = _trace(**options)
    assert _events(fast) == _events(general)
    assert {k: repr(v) for k, v in fast.storages.items()} == \
        {k: repr(v) for k, v in general.storages.items()}


def test_map_plain_matches_tree_map_and_refuses_other_containers():
    t = torch.ones(2)
    args = (t, [t, 3, None], {"b": t, "a": (1.5, torch.float16)}, "s", torch.device("cpu"))
    found: list = []
    mapped = recorder._map_plain(args, lambda x, _: ("meta", id(x)), found)
    assert mapped == tree_map(lambda x: ("meta", id(x)) if isinstance(x, torch.Tensor) else x, args)
    assert found == [("meta", id(t))] * 3  # in tree_flatten order
    assert [x for x in tree_flatten(args)[0] if isinstance(x, torch.Tensor)] == [t] * 3
    with pytest.raises(recorder._NotPlain):
        recorder._map_plain((torch.Size([2, 3]),), lambda x, _: x, [])
