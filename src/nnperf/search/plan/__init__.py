"""``nnperf plan``: layouts of a model on N GPUs, each traced one rank role at a time.

The package, lowest first: ``results`` (what a plan computes, as records), ``states``
(model-state bounds), ``rank`` (one rank traced and reduced to
its figures, deep stacks from two shallow traces), the compositions of a layout's step from
its rank roles (``pipeline``, ``context``; ``evaluate`` chooses among them and composes data
and tensor parallelism itself), ``layouts`` (the candidates), ``axes`` (the degrees searched),
``bounds`` (pipelines left untraced), ``notes``, and ``search`` (the driver: ``plan``).
"""

from nnperf.layout import CHECKPOINT_NAMES, DEFAULT_SCHEDULES
from nnperf.search.plan.axes import request_name
from nnperf.search.plan.evaluate import evaluate, prepare_for
from nnperf.search.plan.notes import smallest_memory
from nnperf.search.plan.results import Plan, Planned
from nnperf.search.plan.search import DATA_KINDS, plan

__all__ = ["CHECKPOINT_NAMES", "DATA_KINDS", "DEFAULT_SCHEDULES", "Plan", "Planned", "evaluate", "plan",
           "prepare_for", "request_name", "smallest_memory"]
