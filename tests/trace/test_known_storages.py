"""The storages whose kind the recorder knows before the step (parameters, buffers, inputs)
are known by object: a storage the step creates at a dead input's address is an activation
(issue 18: a pipeline stage's input, split into micro-batches and freed, passed its kind on to
a later storage, and a stage's memory moved with where Python placed its objects)."""

from __future__ import annotations

import torch

from nnperf.trace.events import KIND_INPUT, KIND_PARAM
from nnperf.trace.recorder import KnownStorages


def test_a_dead_storages_address_does_not_pass_its_kind_on():
    known = KnownStorages()
    dead = torch.empty(16, device="meta")
    address = id(dead.untyped_storage())
    known.add(dead.untyped_storage(), KIND_INPUT)
    del dead
    reused = None
    held = []
    for _ in range(10_000):  # CPython hands a freed object's address to the next of its size
        t = torch.empty(16, device="meta")
        if id(t.untyped_storage()) == address:
            reused = t
            break
        held.append(t)
    assert reused is not None, "no storage landed at the freed address: the test cannot check the lookup"
    assert known.kind_of(reused.untyped_storage()) is None


def test_a_live_storage_keeps_its_first_kind_where_asked():
    known = KnownStorages()
    weight = torch.empty(4, device="meta")
    known.add(weight.untyped_storage(), KIND_PARAM, "fc.weight")
    known.add(weight.untyped_storage(), KIND_INPUT, keep_first=True)  # an input that is a parameter
    assert known.kind_of(weight.untyped_storage()) == (KIND_PARAM, "fc.weight")
    other = torch.empty(4, device="meta")
    assert known.kind_of(other.untyped_storage()) is None
