"""The suite's own settings (``tests/conftest.py``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _suite_conftest():
    """``tests/conftest.py`` itself (``import conftest`` may find a folder's own conftest)."""
    spec = importlib.util.spec_from_file_location("nnperf_suite_conftest", ROOT / "tests" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_module_kept_on_one_worker_exists_and_shares_work_between_its_tests():
    """A module renamed or moved would silently lose its grouping (its shared work done once per
    worker again); one without a module-scoped fixture or a cached function gains nothing."""
    modules = _suite_conftest().SHARED_FIXTURE_MODULES
    assert modules
    for module in modules:
        path = ROOT / module
        assert path.is_file(), module
        text = path.read_text()
        assert 'scope="module"' in text or "functools.cache" in text, module
