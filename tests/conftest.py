"""Settings of the whole suite."""

from __future__ import annotations

import os

if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest-xdist's workers start with COLUMNS=80 and LINES=24 set: the tables would be drawn
    # 80 wide, where off a terminal nnperf draws them wide (report.console) and the tests read
    # them so; a test that wants a width sets COLUMNS itself
    for name in ("COLUMNS", "LINES"):
        os.environ.pop(name, None)
