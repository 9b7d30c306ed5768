"""Settings of the whole suite."""

from __future__ import annotations

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
