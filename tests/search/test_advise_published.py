"""Every reproduction of ``validation/advise_published.py`` recomputed with the current code and
held to its stated tolerance: the predicted gain within +-50% of the published one (a range
widened by 50% at each end). The published figures and their setups are the sources'; nothing
here is a value nnperf printed. A known miss is a strict xfail: when the model is fixed it
passes, the xfail fails, and the note in the script has to change with it."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.accuracy

ROOT = Path(__file__).resolve().parents[2]


def _script():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("advise_published", ROOT / "validation" / "advise_published.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


PUB = _script()
GPT_FAST = functools.cache(PUB.cuda_graphs_gpt_fast)  # two tests read the one reproduction


def _gain_within(r, published_low: float, published_high: float) -> bool:  # type: ignore[no-untyped-def]
    """The tolerance, written out again here: gain = speedup - 1, +-50% of the published gain."""
    gain = r.predicted - 1
    return (published_low - 1) * 0.5 <= gain <= (published_high - 1) * 1.5


def test_nanogpt_vocabulary_padding():
    r = PUB.nanogpt_vocab()
    assert r.published == (1.25, 1.25)  # "about 25% faster"
    assert _gain_within(r, 1.25, 1.25), r.lines()


def test_channels_last_resnet50_amp():
    r = PUB.channels_last_resnet50()
    assert r.published[0] == pytest.approx(0.258 / 0.198)  # the tutorial's s/iter, NCHW -> NHWC
    assert _gain_within(r, 0.258 / 0.198, 0.258 / 0.198), r.lines()
    times = {what: (p, q) for what, p, q in r.times}
    assert times["NCHW step"][0] / times["channels_last step"][0] == pytest.approx(r.predicted)


def test_selective_vs_full_recomputation_22b_layer():
    r = PUB.recompute_korthikanti()
    assert r.published == (1.290, 1.321)  # Table 5: 29.0% .. 32.1% throughput
    assert _gain_within(r, 1.290, 1.321), r.lines()
    per_layer = {what: p for what, p, _ in r.times}
    # the time bought: full recomputation reruns the forward, selective only part of it
    assert per_layer["layer, no recompute"] < per_layer["layer, selective"] < per_layer["layer, full"]


def test_the_22b_slice_has_the_tensor_parallel_shapes():
    """One rank of TP 8: q/k/v of 8 heads x 96, MLP 4h/8 columns; batch 4 x 2048 tokens."""
    import nnperf.analysis as A

    a = A.analyze(PUB.MEGATRON_SLICE, dtype="bf16", optimizer="none", train=False)
    shapes = {(g.module, g.m, g.n, g.k) for g in a.gemms}
    tokens, h = 4 * 2048, 6144
    assert ("layers.0.qkv", tokens, 3 * h // 8, h) in shapes
    assert ("layers.0.proj", tokens, h, h // 8) in shapes
    assert ("layers.0.fc1", tokens, 4 * h // 8, h) in shapes
    assert ("layers.0.fc2", tokens, h, 4 * h // 8) in shapes
    scores = [g for g in a.gemms if g.module == "layers.0" and g.m == 2048 and g.n == 2048]
    assert scores and scores[0].k == 96 and scores[0].batch == 4 * 8  # q k^T per head


@pytest.mark.slow
def test_fused_adamw_on_one_fsdp_rank_of_llama3_8b():
    r = PUB.fused_adamw_torchtitan()
    assert r.published == (1.0163, 1.0362)  # PR #881: min 1.63%, max 3.62%
    assert _gain_within(r, 1.0163, 1.0362), r.lines()


def test_cuda_graphs_gpt_fast_graphed_step():
    """What reproduces: eager decoding is host-bound, the graphed + compiled step is the device's
    time (+-25% of the blog's 107.0 tokens/s)."""
    r = GPT_FAST()
    assert "host-bound" in r.details[0]
    predicted, published = next((p, q) for what, p, q in r.times if what == "graphed + compiled step")
    assert published == pytest.approx(1 / 107.0)
    assert abs(predicted / published - 1) <= 0.25, r.lines()


def test_cuda_graphs_gpt_fast_gain():
    """The blog's +320% within +-50%. The eager step is still predicted short (25.5 ms against
    39.2 ms: the host model's per-op costs come from other hosts than the blog's), which is why
    the predicted gain sits in the lower half of the tolerance."""
    r = GPT_FAST()
    assert _gain_within(r, 107.0 / 25.5, 107.0 / 25.5), r.lines()
