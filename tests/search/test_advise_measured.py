"""Advice measured on a GPU (``validation/advise_measure.py``): which items a real eager step
can make and how, the tolerance a predicted gain is held to, and every committed GPU
measurement re-predicted with the current code."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from nnperf.search.advise.change import Change

pytestmark = pytest.mark.accuracy

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "validation"))
import advise_measure  # noqa: E402

GPT2 = ("gpt2", 8, 1024, {}, {"optimizer": "adamw"})
RECORDED = sorted((ROOT / "validation" / "data").glob("*/advise-measured.json"))


def test_trace_changes_and_tf32_become_the_measured_step():
    overrides, fields, tf32 = advise_measure.scenario(Change(trace=(("amp", "bf16"),)), GPT2)
    assert (overrides, fields, tf32) == ({}, {"optimizer": "adamw", "amp": "bf16"}, False)
    assert advise_measure.scenario(Change(tf32=True), GPT2) == ({}, {"optimizer": "adamw"}, True)


def test_a_padded_vocabulary_rebuilds_the_model_with_it():
    overrides, _, _ = advise_measure.scenario(Change(pad=((50257, 50304),)), GPT2)
    assert overrides == {"vocab": 50304}


def test_what_an_eager_step_cannot_make_says_why():
    for change in (Change(fuse=True), Change(graphs=True), Change(recompute="full"), Change(batch=16),
                   Change(trace=(("set_to_none", True),))):
        assert isinstance(advise_measure.scenario(change, GPT2), str)
    why = advise_measure.scenario(Change(pad=((768, 832),)), GPT2)  # the hidden size, not the vocabulary
    assert "n_embd" in why


def test_a_gain_is_held_to_half_of_itself_and_a_null_gain_to_two_percent():
    assert advise_measure.within(0.30, 0.20) and advise_measure.within(0.11, 0.20)
    assert not advise_measure.within(0.31, 0.20) and not advise_measure.within(0.09, 0.20)
    assert advise_measure.within(-0.02, 0.01) and not advise_measure.within(0.05, 0.01)


@pytest.mark.skipif(not RECORDED, reason="no advice measured on a GPU yet (validation/gpu_session.sh 1 records it)")
@pytest.mark.parametrize("path", RECORDED, ids=[p.parent.name for p in RECORDED])
def test_measured_gains_are_predicted_within_tolerance(path):
    misses = []
    for workload, item, measured, predicted in advise_measure.repredict(json.loads(path.read_text())):
        if not advise_measure.within(predicted, measured) and item not in advise_measure.MISSES.get(workload, {}):
            misses.append(f"{workload} {item}: measured {measured:+.1%}, predicted {predicted:+.1%}")
    assert not misses, misses
