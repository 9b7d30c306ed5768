"""What the fork server of ``fit_parallel`` loads before it forks search workers.

Importing this module imports everything a search needs and runs one inference search step
(trace and memory prediction of the built-in ``mlp`` at batch 1): the first trace in a
process pays about two seconds of PyTorch's lazy imports and caches, which every worker
forked from the server then inherits instead of paying again. Inference only: a backward
would start autograd's device threads on CUDA builds of PyTorch, after which no forked
worker could run autograd (the very reason the fork server exists).

Only the fork server imports it (``fit_parallel.FORKSERVER_PRELOAD``).
"""

from __future__ import annotations

import gc

from nnperf.request import ModelRequest
from nnperf.search.fit import trace_measure
from nnperf.search.memory_variants import MemoryOptions
from nnperf.trace.options import TraceOptions


def warm_up() -> None:
    """One inference search step, for its side effects on PyTorch's caches."""
    trace_measure(ModelRequest("mlp"), MemoryOptions(TraceOptions(train=False)))(1)


warm_up()
# what the server holds now (torch, nnperf, the warm-up's caches) to the permanent generation:
# the workers it forks never walk it in their collections (a tenth of a trace's time otherwise)
gc.freeze()
