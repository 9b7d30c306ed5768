"""nnperf: how fast and how big a PyTorch network will be on a GPU, and why.

``analyze`` traces one step and counts it; ``predict`` adds time on a GPU. Both are imported
lazily so ``import nnperf`` stays cheap for the CLI.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["analyze", "predict"]


def analyze(*args: Any, **kwargs: Any):
    from nnperf.analysis import analyze as _analyze

    return _analyze(*args, **kwargs)


def predict(*args: Any, **kwargs: Any):
    from nnperf.prediction import predict as _predict

    return _predict(*args, **kwargs)


analyze.__doc__ = "Trace one step of a model on fake tensors and count it (see nnperf.analysis.analyze)."
predict.__doc__ = "Predict one step of a model on a GPU (see nnperf.prediction.predict)."
