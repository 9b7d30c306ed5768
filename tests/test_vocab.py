"""The vocabularies behave exactly like the strings they replaced (JSON, dicts, formatting)."""

from __future__ import annotations

import csv
import io
import json
import pickle

import pytest

from nnperf.passes.costs import registry
from nnperf.passes.memory.report import CATEGORIES, CATEGORY_LABELS, category_label
from nnperf.trace import events
from nnperf.vocab import Bound, Category, MemoryCategory, Phase, StorageKind

ALL = [*Phase, *StorageKind, *Category, *Bound, *MemoryCategory]


@pytest.mark.parametrize("member", ALL, ids=[f"{type(m).__name__}.{m.name}" for m in ALL])
def test_a_member_is_its_string(member):
    value = member.value
    assert member == value and value == member
    assert hash(member) == hash(value)
    assert {value: 1}[member] == 1 and {member: 1}[value] == 1
    assert str(member) == f"{member}" == value
    assert f"{member:>20}" == f"{value:>20}"
    assert json.dumps({member: [member]}) == json.dumps({value: [value]})
    assert pickle.loads(pickle.dumps(member)) is member
    buf = io.StringIO()
    csv.writer(buf).writerow([member])
    assert buf.getvalue().strip() == value


def test_the_words_are_the_documented_ones():
    assert events.PHASES == ("forward", "backward", "optimizer")
    assert {str(c) for c in Category} == {
        "gemm", "conv", "attention", "elementwise", "reduction", "norm", "memory", "optimizer",
        "alloc", "host", "communication", "uncovered",
    }
    assert {str(b) for b in Bound} == {"compute", "memory", "launch", "host", "none"}
    assert CATEGORIES == (
        "parameters", "buffers", "inputs", "gradients", "optimizer_state", "amp_weight_casts",
        "saved_activations", "forward_temporaries", "backward_temporaries",
        "optimizer_temporaries", "workspaces",
    )


def test_module_level_names_are_the_members():
    assert registry.GEMM is Category.GEMM and registry.HOST is Category.HOST
    assert registry.UNCOVERED == "uncovered"
    assert events.KIND_PARAM is StorageKind.PARAMETER
    assert events.KIND_OPT_STATE == "optimizer_state"
    assert set(CATEGORY_LABELS) == set(CATEGORIES)
    assert category_label("optimizer_state") == "optimizer state"  # by plain string too
    assert category_label("allocator_rounding") == "allocator rounding"
