"""An advice item predicted on one rank of a multi-GPU layout.

On one GPU an item's gain is measured against the whole model's step; under FSDP each rank's
optimizer updates only its shard of the parameters while its forward and backward still run
the whole model, so an optimizer item's share of the step is a fraction of what the
single-GPU what-if shows. This module applies an item's trace-level change to the rank's step
that ``nnperf plan`` traces (``search.plan.evaluate``: the real ``fully_shard`` / DDP engine
on a fake process group, collectives on the cluster's links beside the compute) and predicts
it there.
"""

from __future__ import annotations

from dataclasses import fields, replace

from nnperf.errors import UsageError
from nnperf.hardware import GPU
from nnperf.hardware.cluster import Cluster
from nnperf.layout import Execution
from nnperf.request import ModelRequest
from nnperf.search import plan
from nnperf.search.advise.change import Change
from nnperf.trace.options import TraceOptions

_TRACE_FIELDS = {f.name for f in fields(TraceOptions)}


def evaluate_on_layout(request: ModelRequest, options: TraceOptions, change: Change, execution: Execution,
                       gpu: GPU, cluster: Cluster) -> plan.Planned:
    """Rank 0's step of ``execution`` with ``change`` applied, traced and timed as ``plan`` does.

    Only changes of how the step is traced apply here (optimizer implementation, precision,
    memory format, recomputation); a re-timing of the single-GPU trace (padding, fusion,
    CUDA graphs, another GPU) has no per-rank equivalent yet and is refused.
    """
    retimed = [name for name, on in (("pad", change.pad), ("fp8", change.fp8), ("fuse", change.fuse),
                                     ("sdpa", change.sdpa), ("graphs", change.graphs), ("tf32", change.tf32),
                                     ("gpu", change.gpu), ("batch", change.batch)) if on]
    other = [key for key, _ in change.trace if key not in _TRACE_FIELDS]
    if retimed or other:
        raise UsageError(f"cannot predict {', '.join(retimed + other)} on a multi-GPU layout yet; "
                         "trace-level changes only (optimizer implementation, precision, channels_last, "
                         "recomputation)")
    options = replace(options, **dict(change.trace))
    if change.recompute is not None:
        execution = replace(execution, checkpoint=change.recompute)
    return plan.evaluate(request, options, execution, gpu, cluster)
