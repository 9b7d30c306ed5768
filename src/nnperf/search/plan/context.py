"""Context parallelism (ring attention over the sequence) in closed form on a traced rank.

PyTorch's context parallelism (``torch.distributed.tensor.experimental.context_parallel``)
replaces scaled-dot-product attention by its own ring attention while a context manager is
active; nnperf's tracer routes attention to its fused op, so the two cannot be composed yet and
this path is not traced. The plan models it as torchtitan runs it (``context_parallel_degree``,
rotate method "allgather", the load-balanced split of the sequence in 2 x cp chunks, FSDP over
the data and context ranks together: ``dp_shard_cp``), with these stated assumptions:

- the rank is traced with the layout's tensor and data parallelism on ``seq / cp`` tokens (FSDP
  sharding over ``shard x cp`` ranks): everything but attention is what one CP rank runs;
- attention: each rank's queries meet every earlier key of the whole sequence, ``cp`` times the
  causal pairs of its own chunk (load-balanced), so the traced attention time is multiplied by
  ``cp``;
- communication per attention layer: an all-gather of K and V over the CP group in forward, the
  same again in backward and a reduce-scatter of their gradients (nccl-tests sizes: the gathered
  K + V), counted exposed (the all-gather precedes the attention it feeds; an upper bound);
- memory: the gathered K and V of two layers (one in use, one being gathered) beside the traced
  rank's peak.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from nnperf.errors import UsageError
from nnperf.hardware import GPU
from nnperf.hardware.cluster import Cluster
from nnperf.kernels.collectives import estimate_collective
from nnperf.layout import Execution
from nnperf.passes.memory.capacity import capacity, fits
from nnperf.request import ModelRequest
from nnperf.search.plan.rank import RoleCache, scaled_cost
from nnperf.search.plan.results import CollectiveTotals, Planned, TimeSplit, collective_totals
from nnperf.trace.options import TraceOptions


def context_group(execution: Execution) -> tuple[int, ...]:
    """Rank 0's context-parallel group: torchtitan's mesh [pp, dp_replicate, dp_shard, cp, tp]
    puts the CP ranks ``tensor`` apart."""
    return tuple(i * execution.tensor for i in range(execution.context))


def context_step(request: ModelRequest, options: TraceOptions, execution: Execution, gpu: GPU,
                 cluster: Cluster, layers: int | None, cache: RoleCache, prepare: Any, seq: int) -> Planned:
    cp = execution.context
    if seq % (2 * cp):
        valid = [d for d in range(1, 65) if seq % (2 * d) == 0]
        below = max((d for d in valid if d < cp), default=1)
        above = min((d for d in valid if d > cp), default=None)
        raise UsageError(f"context parallel degree {cp} does not split the {seq}-token sequence into 2 x {cp} "
                         f"equal chunks; nearest valid degrees: {below}" + (f" or {above}" if above else ""))
    # the context ranks join the FSDP shard group (torchtitan's dp_shard_cp); without data
    # parallelism they form it alone
    data = "fsdp" if execution.data == "ddp" else execution.data
    traced = replace(execution, context=1, shard=execution.shard * cp, data=data)
    cost = scaled_cost(replace(request, batch=execution.micro_batch, seq_len=seq // cp), options, traced, gpu,
                       cluster, 0, layers, cache, prepare)
    f = cost.figures
    group = context_group(execution)
    layer_kv = f.kv_bytes / f.attention_layers if f.attention_layers else 0.0
    gathered = int(layer_kv * cp)
    per_layer = (2 * estimate_collective("all_gather", gathered, group, cluster).time_s
                 + estimate_collective("reduce_scatter", gathered, group, cluster).time_s)
    comm = per_layer * f.attention_layers
    attention_extra = f.attention_s * (cp - 1)
    accum = execution.grad_accum
    once = f.once_span_s  # the optimizer and clipping: once per step
    micro_step = f.step_s - once + attention_extra + comm
    step = accum * micro_step + once
    exposed = {k: v * accum for k, v in f.exposed_s.items() if v > 0}
    exposed["context_all_gather_reduce_scatter"] = comm * accum
    counts = collective_totals(f)
    layers_n = round(f.attention_layers)
    counts["context_all_gather"] = CollectiveTotals(2 * layers_n, 2 * layers_n * gathered)
    counts["context_reduce_scatter"] = CollectiveTotals(layers_n, layers_n * gathered)
    # a CP group of cp ranks runs one micro-batch's whole sequence, each rank seq / cp of it
    tokens = cost.per_micro * accum * execution.data_parallel * cp
    flops = f.flops + f.attention_flops * (cp - 1)
    planned = Planned(
        execution, step_s=step, throughput=tokens / step if step else 0.0, throughput_unit=cost.unit,
        mfu=flops * accum / step / cost.mfu_peak if step and cost.mfu_peak else 0.0,
        memory_bytes=int(f.memory + 2 * gathered), context_bytes=int(f.mem_context),
        split=TimeSplit(compute_s=(f.compute_s + attention_extra) * accum,
                        recomputation_s=f.recompute_s * accum,
                        communication_s=(f.comm_s + comm) * accum, exposed_communication_s=exposed,
                        overlap_slowdown_s=f.slowdown_s * accum,
                        host_s=f.host_s * accum,
                        context_parallel="closed form (search.plan.context): ring attention not traced"),
        state_bytes=replace(f.states), collectives=counts,
    )
    planned.fits = fits(planned.memory_bytes, capacity(gpu))
    return planned
