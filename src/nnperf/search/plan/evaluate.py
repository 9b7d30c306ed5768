"""One layout traced, timed and sized: each way a layout's step is composed from its traced
rank roles in one place, chosen here (``evaluate``): a pipeline replayed from its stage roles
(``plan.pipeline``; with context parallelism, each role with its ring attention), context
parallelism in closed form on a traced rank (``plan.context``), and data and tensor
parallelism from the one rank role they have (``data_tensor_step``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from nnperf import progress
from nnperf.errors import UsageError
from nnperf.hardware import GPU
from nnperf.hardware.cluster import Cluster
from nnperf.layout import Execution
from nnperf.passes.memory.capacity import capacity, fits
from nnperf.request import ModelRequest
from nnperf.search.memory_variants import apply_checkpointing
from nnperf.search.plan.axes import model_info
from nnperf.search.plan.context import context_step
from nnperf.search.plan.expert_overlap import hidden_all_to_alls
from nnperf.search.plan.main_params import with_main_params
from nnperf.search.plan.pipeline import pipeline_step
from nnperf.search.plan.rank import RoleCache, layers_of, scaled_cost
from nnperf.search.plan.results import Planned, TimeSplit, collective_totals, per_step
from nnperf.trace.options import TraceOptions

#: torchtitan runs async tensor parallelism with its compiled blocks only (``parallelize_llama``,
#: later ``CompileConfig``: "Async TP requires torch.compile").
ASYNC_TP_NEEDS_COMPILE = ("--async-tp is torch's async tensor parallelism, which Inductor's compiled blocks run "
                          "(torchtitan refuses it without torch.compile): add --pointwise fused")


def prepare_for(execution: Execution) -> Any:
    """What the layout's activation checkpointing does to a built workload (None: nothing)."""
    if not execution.checkpoint:
        return None
    policy = execution.checkpoint if execution.checkpoint != "full" else False
    return lambda workload: apply_checkpointing(workload, selective=policy)


def evaluate(request: ModelRequest, options: TraceOptions, execution: Execution, gpu: GPU,
             cluster: Cluster, *, layers: int | None = None, cache: RoleCache | None = None,
             prune: bool = False, slower_than: float | None = None) -> Planned:
    """Trace, time and size one layout (``layers``: the depth of a built-in stack, to trace it
    shallow and extrapolate; ``cache``: traced roles shared by a search; ``prune``: a pipeline
    whose first stage alone cannot fit is left at that lower bound, untimed:
    ``search.plan.pipeline``). A pipeline splits a built-in stack by its depth, so one given
    no ``layers`` reads it off the model (``layers_of``): traced whole instead, the model's
    blocks would be split over the three stages its roles are traced on, not its own."""
    execution.validate()  # one line for a layout that cannot run, before any of it is traced
    if execution.async_tp and options.pointwise != "fused":
        raise UsageError(ASYNC_TP_NEEDS_COMPILE)
    planned = _composed(request, options, execution, gpu, cluster, layers, cache or RoleCache(), prune, slower_than)
    return with_main_params(planned, execution, options, gpu)


def _composed(request: ModelRequest, options: TraceOptions, execution: Execution, gpu: GPU, cluster: Cluster,
              layers: int | None, cache: RoleCache, prune: bool, slower_than: float | None) -> Planned:
    """The layout's step and memory as its way of composition gives them (module docstring)."""
    if execution.pipeline > 1 and layers is None:
        layers = layers_of(request)
    progress.note(execution.describe())
    if execution.context > 1:
        info = model_info(request, layers)
        seq = request.seq_len or (info[2] if info else None)
        if not seq:
            raise UsageError("context parallelism needs a sequence length (--seq)")
        if execution.pipeline > 1:
            return pipeline_step(replace(request, seq_len=seq), options, execution, gpu, cluster, layers, cache,
                                 prepare_for(execution), prune, slower_than)
        return context_step(request, options, execution, gpu, cluster, layers, cache, prepare_for(execution), seq)
    if execution.pipeline > 1:
        return pipeline_step(request, options, execution, gpu, cluster, layers, cache, prepare_for(execution), prune,
                             slower_than)
    return data_tensor_step(request, options, execution, gpu, cluster, layers, cache)


def data_tensor_step(request: ModelRequest, options: TraceOptions, execution: Execution, gpu: GPU,
                     cluster: Cluster, layers: int | None, cache: RoleCache) -> Planned:
    """A layout without pipeline or context parallelism: its one rank role traced with one
    micro-batch, the micro-batches accumulated around the optimizer, which runs once."""
    # the overlap is the composition's (below): the trace without it is the same rank's
    cost = scaled_cost(replace(request, batch=execution.micro_batch), options, replace(execution, expert_overlap=False),
                       gpu, cluster, 0, layers, cache, prepare_for(execution))
    f = cost.figures
    accum = execution.grad_accum

    # over the accumulated step, what runs once counted once (``per_step``): the optimizer and
    # gradient clipping (``trace.step.once_per_step``), and DDP's (ZeRO-1's) reduction, which
    # only the last micro-batch runs (``RankFigures.sync_s``)
    host = per_step(accum, f.host_s, f.optimizer_host_s)
    compute = per_step(accum, f.compute_s, f.optimizer_s + f.sync_kernel_s + f.sync_slowdown_s)
    # Megatron-Core's expert overlap runs each backward beside the next forward: all but the
    # last of the micro-batches' (``search.plan.expert_overlap``)
    overlapped = (accum - 1) * f.expert_overlap_s if execution.expert_overlap else 0.0
    # the host's and the device's totals bound the accumulated step from below: a traced
    # micro-batch bound by one may be bound by the other once its optimizer share is taken out
    step = max(per_step(accum, f.step_s, f.once_span_s + f.sync_s) - overlapped, host, compute)
    planned = Planned(
        execution, step_s=step,
        throughput=cost.per_micro * accum * execution.data_parallel / step if step else 0.0,
        throughput_unit=cost.unit,
        mfu=f.flops * accum / step / cost.mfu_peak if step and cost.mfu_peak else 0.0,
        memory_bytes=int(f.memory), context_bytes=int(f.mem_context),
        split=TimeSplit(compute_s=compute,
                        recomputation_s=f.recompute_s * accum,
                        communication_s=f.comm_over(accum),
                        overlap_slowdown_s=f.slowdown_over(accum),
                        exposed_communication_s=hidden_all_to_alls(f.exposed_over(accum), overlapped),
                        host_s=per_step(accum, f.host_busy_s, f.optimizer_host_s)),
        state_bytes=replace(f.states), collectives=collective_totals(f),
        param_row_bytes=f.param_row_bytes, loss_saved_bytes=int(f.loss_saved),
        per_block=cost.per_block, rank=cost.rank,
    )
    planned.fits = fits(planned.memory_bytes, capacity(gpu))
    return planned
