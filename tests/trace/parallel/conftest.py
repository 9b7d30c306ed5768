"""The strategies' tests share the gloo helpers of ``tests/trace`` (``gloo_ranks``)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
