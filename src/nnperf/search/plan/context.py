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
from nnperf.search.plan.results import Planned, RankCost, TimeSplit, collective_totals, per_step
from nnperf.trace.options import TraceOptions


def context_group(execution: Execution) -> tuple[int, ...]:
    """Rank 0's context-parallel group: torchtitan's mesh [pp, dp_replicate, dp_shard, cp, tp]
    puts the CP ranks ``tensor`` apart."""
    return tuple(i * execution.tensor for i in range(execution.context))


def check_sequence(seq: int, cp: int) -> None:
    """One line where ``cp`` does not split the sequence into 2 x cp equal chunks."""
    if seq % (2 * cp):
        valid = [d for d in range(1, 65) if seq % (2 * d) == 0]
        below = max((d for d in valid if d < cp), default=1)
        above = min((d for d in valid if d > cp), default=None)
        raise UsageError(f"context parallel degree {cp} does not split the {seq}-token sequence into 2 x {cp} "
                         f"equal chunks; nearest valid degrees: {below}" + (f" or {above}" if above else ""))


def traced_as(execution: Execution) -> Execution:
    """The layout a context-parallel rank is traced as, on ``seq / cp`` tokens: no context
    parallelism, its context ranks in the data-parallel group (their gradients are reduced
    together): FSDP sharded over the data and context ranks (torchtitan's ``dp_shard_cp``; a
    layout without data parallelism shards over its context ranks alone), DDP and ZeRO-1 over
    them (Megatron-LM's data-parallel group with context parallelism, ``Execution.megatron_layout``;
    so is a layout of one of Megatron-LM's own settings without data parallelism)."""
    cp = execution.context
    if execution.megatron_layout:
        return replace(execution, context=1)
    data = "fsdp" if execution.data == "ddp" else execution.data
    return replace(execution, context=1, shard=execution.shard * cp, data=data)


def with_ring_attention(cost: RankCost, execution: Execution, cluster: Cluster) -> RankCost:
    """``cost``, a rank traced as ``traced_as(execution)``, with the ring attention of its
    ``cp`` ranks added (the module docstring's assumptions): attention ``cp`` times the traced
    one's time and FLOPs, per attention layer an exposed all-gather of the whole sequence's K
    and V in forward, and again with a reduce-scatter of their gradients in backward, the
    gathered K and V of two layers in memory, ``cp`` times the tokens of a micro-batch. A
    pipeline role's forward and backward actions take their share."""
    cp = execution.context
    f = replace(cost.figures, exposed_s=dict(cost.figures.exposed_s), action_s=dict(cost.figures.action_s),
                collective_count=dict(cost.figures.collective_count),
                collective_bytes=dict(cost.figures.collective_bytes))
    group = context_group(execution)
    layer_kv = f.kv_bytes / f.attention_layers if f.attention_layers else 0.0
    gathered = int(layer_kv * cp)
    gather = estimate_collective("all_gather", gathered, group, cluster).time_s
    scatter = estimate_collective("reduce_scatter", gathered, group, cluster).time_s
    forward_extra = f.attention_forward_s * (cp - 1) + gather * f.attention_layers
    backward_extra = (f.attention_s - f.attention_forward_s) * (cp - 1) + (gather + scatter) * f.attention_layers
    comm = (2 * gather + scatter) * f.attention_layers
    attention_extra = f.attention_s * (cp - 1)
    f.step_s += attention_extra + comm
    f.compute_s += attention_extra
    f.recompute_s += f.attention_recomputed_s * (cp - 1)  # the ring's share of what checkpointing reruns
    f.comm_s += comm
    f.exposed_s["context_all_gather_reduce_scatter"] = f.exposed_s.get("context_all_gather_reduce_scatter", 0.0) + comm
    for key in f.action_s:
        f.action_s[key] += forward_extra if key.startswith("F") else backward_extra
    layers = round(f.attention_layers)
    for kind, count in (("context_all_gather", 2 * layers), ("context_reduce_scatter", layers)):
        f.collective_count[kind] = f.collective_count.get(kind, 0.0) + count
        f.collective_bytes[kind] = f.collective_bytes.get(kind, 0.0) + count * gathered
    f.flops += f.attention_flops * (cp - 1)
    f.memory += 2 * gathered
    for phase in f.memory_by_phase:
        f.memory_by_phase[phase] += 2 * gathered
    # a CP group of cp ranks runs one micro-batch's whole sequence, each rank seq / cp of it
    return replace(cost, figures=f, per_micro=cost.per_micro * cp)


def context_step(request: ModelRequest, options: TraceOptions, execution: Execution, gpu: GPU,
                 cluster: Cluster, layers: int | None, cache: RoleCache, prepare: Any, seq: int) -> Planned:
    check_sequence(seq, execution.context)
    traced = traced_as(execution)
    base = scaled_cost(replace(request, batch=execution.micro_batch, seq_len=seq // execution.context), options,
                       traced, gpu, cluster, 0, layers, cache, prepare)
    cost = with_ring_attention(base, execution, cluster)
    f, plain = cost.figures, base.figures
    accum = execution.grad_accum
    # the optimizer and clipping once per step, and DDP's (ZeRO-1's) reduction (``no_sync``)
    step = per_step(accum, f.step_s, f.once_span_s + f.sync_s)
    tokens = cost.per_micro * accum * execution.data_parallel
    planned = Planned(
        execution, step_s=step, throughput=tokens / step if step else 0.0, throughput_unit=cost.unit,
        mfu=f.flops * accum / step / cost.mfu_peak if step and cost.mfu_peak else 0.0,
        memory_bytes=int(f.memory), context_bytes=int(f.mem_context),
        split=TimeSplit(compute_s=per_step(accum, f.compute_s, f.optimizer_s + f.sync_kernel_s + f.sync_slowdown_s),
                        recomputation_s=f.recompute_s * accum,
                        communication_s=f.comm_over(accum), exposed_communication_s=f.exposed_over(accum),
                        overlap_slowdown_s=f.slowdown_over(accum),
                        host_s=per_step(accum, f.host_busy_s, f.optimizer_host_s),
                        context_parallel="closed form (search.plan.context): ring attention not traced"),
        state_bytes=replace(plain.states), collectives=collective_totals(f),
    )
    planned.fits = fits(planned.memory_bytes, capacity(gpu))
    return planned
