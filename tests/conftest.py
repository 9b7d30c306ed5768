"""Settings of the whole suite."""

from __future__ import annotations

import importlib.util
import os

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest-xdist's workers start with COLUMNS=80 and LINES=24 set: the tables would be drawn
    # 80 wide, where off a terminal nnperf draws them wide (report.console) and the tests read
    # them so; a test that wants a width sets COLUMNS itself
    for name in ("COLUMNS", "LINES"):
        os.environ.pop(name, None)


@pytest.fixture
def predicted_timings(monkeypatch):
    """The ``TimingOptions`` of every ``prediction.predict_analysis`` call the test makes, in
    order (the real prediction still runs): what a command passed down, seen where it lands."""
    import nnperf.prediction as prediction

    seen = []
    real = prediction.predict_analysis

    def spy(analysis, gpu, profile=None, timing=None, memory=None):
        seen.append(timing)
        return real(analysis, gpu, profile, timing, memory)

    monkeypatch.setattr(prediction, "predict_analysis", spy)
    return seen


#: Modules whose tests share work that costs seconds to minutes, in a module fixture or a cached
#: function (the published rows' predictions, the CPU memory measurements re-predicted, gloo
#: ranks started once, traced pipeline layouts): under
#: pytest-xdist each runs on one worker, so that work is done once, and first (the largest
#: groups start first), so that the longest work does not start last.
SHARED_FIXTURE_MODULES = frozenset({
    "tests/measure/test_published.py",
    "tests/measure/test_cpu_memory_validation.py",
    "tests/measure/test_validation_harness.py",
    "tests/trace/parallel/test_data.py",
    "tests/trace/parallel/test_tensor.py",
    "tests/trace/parallel/test_expert.py",
    "tests/trace/parallel/test_pipeline.py",
    "tests/trace/parallel/test_distributed_optimizer.py",
    "tests/trace/test_chunked_loss_tensor_parallel.py",
    "tests/trace/test_clip.py",
    "tests/trace/test_distributed.py",
    "tests/search/plan/test_bounds.py",
    "tests/search/test_advise_published.py",
    "tests/search/test_fit.py",
})


if importlib.util.find_spec("xdist") is not None:

    def pytest_xdist_make_scheduler(config, log):
        """xdist's default distribution (``-n N``), test by test, except that the tests of a
        ``SHARED_FIXTURE_MODULES`` module go to one worker together."""
        if config.getvalue("dist") != "load":
            return None
        from xdist.scheduler import LoadScopeScheduling

        class SharedFixtureScheduling(LoadScopeScheduling):
            def _split_scope(self, nodeid: str) -> str:
                module = nodeid.split("::", 1)[0]
                return module if module in SHARED_FIXTURE_MODULES else nodeid

        return SharedFixtureScheduling(config, log)
