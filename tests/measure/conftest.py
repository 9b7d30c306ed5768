"""What the measurement tests share."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def run_validation_script() -> Callable[..., subprocess.CompletedProcess]:
    """Run ``validation/<name>`` with ``args`` in a real process, the checkout's ``src`` on its
    path, as a GPU session calls it (a dry run of the device script): its completed process."""
    def run(name: str, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        return subprocess.run([sys.executable, str(ROOT / "validation" / name), *args], capture_output=True,
                              text=True, env=env, timeout=timeout, check=False)
    return run
