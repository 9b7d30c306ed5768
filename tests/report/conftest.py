"""Fixtures of the report tests; the browser driver lives in ``report_helpers`` (a unique
module name, so importing it never collides with another directory's conftest)."""

from report_helpers import browser, chromium_path, mlp_prediction, page

__all__ = ["browser", "chromium_path", "mlp_prediction", "page"]
