"""Pipelines left untraced where traced layouts already rule them out (the search's second
pass): a layout doing the same kernels per GPU (``same_work``) bounds a pipeline's memory from
below and its compute from below, one of the same tensor split its memory (``work_bound``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from nnperf.layout import Execution
from nnperf.search.plan.pipeline import (
    blocks_in_flight,
    replay_orders,
    unsharded_extra,
    unsharded_per_stored,
)
from nnperf.search.plan.results import Planned
from nnperf.trace.options import TraceOptions


def _work_key(execution: Execution) -> tuple[Any, ...]:
    """What decides the kernels a GPU runs over a step, whatever the data and pipeline layout:
    the tensor split, the checkpointing, the micro-batch, and torch's async tensor parallelism
    (the sums of its reduce-scatters, on the compute stream: ``search.plan.rank``)
    (``same_work``)."""
    return *_split_key(execution), execution.checkpoint, execution.micro_batch, execution.async_tp


def same_work(results: Iterable[Planned]) -> dict[tuple[Any, ...], list[Planned]]:
    """The traced layouts without a pipeline, by the work their GPUs do (``_work_key``).

    A pipeline of ``p`` stages over the same GPUs, tensor split, checkpointing and micro-batch
    does the same kernels per GPU on average: each rank runs ``1/p`` of the blocks for ``p``
    times the samples (its data-parallel group is ``p`` times smaller), the embedding and the
    head run on one rank in ``p`` for ``p`` times the samples, and FSDP's shards (of ``1/p`` of
    the parameters over ``1/p`` of the ranks) give each GPU the same optimizer step. Its step
    is at least its busiest rank's compute, so at least that average: the layout's compute
    without what overlapping collectives slowed (which the layouts' communication decides)."""
    out: dict[tuple[Any, ...], list[Planned]] = {}
    for p in results:
        if p.execution.pipeline > 1 or p.time_bound or p.memory_bound or not p.split:
            continue
        out.setdefault(_work_key(p.execution), []).append(p)
    return out


def work_bound(execution: Execution, work: dict[tuple[Any, ...], list[Planned]], slower_than: float | None,
               capacity_bytes: float | None = None, layers: int | None = None,
               options: TraceOptions | None = None) -> Planned | None:
    """``execution`` (a pipeline) left untraced at a bound that a traced layout doing the same
    work per GPU gives (``same_work``), or None where neither bound rules it out:

    - memory, where it exceeds ``capacity_bytes``: rank 0 holds its blocks' parameters and
      optimizer state (its chunks' blocks sharded over its shard group, each block's bytes
      those of an FSDP layout's shard times its shard group) and the saved activations of the
      blocks its schedule keeps in flight (``blocks_in_flight``), each block's as in that FSDP
      layout (the same micro-batch, tensor split and checkpointing; the pipelines are FSDP's
      too: DDP's blocks save autocast's weight casts besides, 419 against 337 KB a block of a
      small Llama); an FSDP/HSDP pipeline, which does not reshard after forward, also holds the
      gathered copy of every block of its first chunk when its first backward starts (its
      traced role's): a block's parameters in the dtype FSDP2 gathers them in (``options``:
      MixedPrecisionPolicy's param_dtype under --amp; the model's own dtype otherwise), and
      the gathered blocks and accumulated gradients of its later chunks where its real order
      keeps them (``plan.pipeline.unsharded_extra``, as the composed pipeline counts them; not
      with experts, whose shard group is smaller); everything else it holds only adds. Without
      an FSDP layout of the same work, one of the same tensor split (whose blocks'
      parameters and optimizer state are the same at any micro-batch and checkpointing) bounds
      the states alone, the activations left out. At the end of its first chunk's last
      backward, an FSDP/HSDP pipeline holds, besides its states and that gathered copy, the
      chunk's whole gradient, accumulated in the reduce dtype (torch's stage reduce-scatters
      it only after that backward), its activations freed: the larger of the two moments bounds
      it (a 175B GPT's 24-block chunks over TP 2: 40 GiB gathered in bf16, 81 GiB of fp32
      gradient);
    - time, where it is no faster than ``slower_than``: the least compute of those layouts."""
    same = work.get(_work_key(execution), []) if execution.pipeline > 1 else []
    sharded = next((p for p in same if p.execution.data == "fsdp" and p.per_block is not None), None)
    split = None if sharded or execution.pipeline == 1 else next(
        (p for group in work.values() for p in group if p.execution.data == "fsdp" and p.per_block is not None
         and _split_key(p.execution) == _split_key(execution)), None)
    source = sharded or split
    if capacity_bytes is not None and layers and source and not execution.replicates_parameters:
        block = source.per_block
        shards = _shards(source.execution)
        depths = execution.chunk_layers(layers)
        own = sum(depths[::execution.pipeline])  # rank 0's blocks
        # the layout's per-GPU bytes of a block, less FSDP2's padding (at most one row of each
        # parameter per rank), times its shard group, are at most the block's (per tensor-
        # parallel rank); rank 0 holds its own blocks over its own shard group
        params = max(0.0, block.states.parameters - block.param_row_bytes)
        optimizer = block.states.optimizer_state * params / block.states.parameters if block.states.parameters else 0.0
        states = own * (params + optimizer) * shards / _shards(execution)
        held = states
        parts = ["parameters", "optimizer state"]
        if sharded:
            held += blocks_in_flight(execution, layers) * block.saved_activations
            parts.append("in-flight saved activations")
        # per byte of a stored shard: FSDP2's gathered copy, its accumulated gradient
        gathered, accumulated = unsharded_per_stored(execution, options) if options else (0.0, 0.0)

        def stored(stage: int) -> float:  # a chunk's shard of its blocks over this layout's group
            return depths[stage] * params * shards / _shards(execution)

        first_gathered = gathered * stored(0) if gathered and not execution.reshard_after_forward else 0.0
        if first_gathered:
            # its first chunk's, in its traced role as ``plan.pipeline`` composes rank 0
            held += first_gathered
            parts[0] = "parameters (sharded and gathered)"
        later = unsharded_extra(replay_orders(execution)[0], 0, lambda s: gathered * stored(s),
                                lambda s: accumulated * stored(s)) if gathered else 0.0
        if later:
            held += later
            parts.insert(1, "its later chunks' gathered blocks and gradients")
        # the end of its first chunk's last backward, its activations freed: torch's stage defers
        # FSDP2's reduce-scatter and reshard to after it (``backward_maybe_with_nosync``:
        # ``set_requires_gradient_sync(False)``, ``set_reshard_after_backward(False)``, then
        # ``post_backward`` by hand), so the chunk's gradient is whole, accumulated in the reduce
        # dtype, beside its gathered copy (whether or not it reshards after forward: backward
        # gathers the blocks again), as its traced role holds them
        ending = states + (gathered + accumulated) * stored(0)
        if ending > held and ending > capacity_bytes:
            return Planned(execution, memory_bytes=int(ending),
                           memory_bound=f"its blocks' parameters and optimizer state, and its first chunk's "
                                        f"gathered copy and whole accumulated gradient at the end of its backward, "
                                        f"alone, each block's as in {source.execution.describe()}")
        if held > capacity_bytes:
            return Planned(execution, memory_bytes=int(held),
                           memory_bound=f"its blocks' {', '.join(parts[:-1])} and {parts[-1]} alone, each block's "
                                        f"as in {source.execution.describe()}")
    if slower_than is None or not same:
        return None
    least = min(same, key=_compute_alone)
    if _compute_alone(least) < slower_than:
        return None
    return Planned(execution, step_s=_compute_alone(least), fits=True, memory_bound="not traced",
                   time_bound=f"its GPUs' compute: the same kernels per GPU as {least.execution.describe()}")


def _split_key(execution: Execution) -> tuple[Any, ...]:
    """What decides a GPU's share of a block's parameters and optimizer state, whatever the
    micro-batch and checkpointing."""
    e = execution
    return e.tensor, e.sequence_parallel, e.context, e.expert


def _shards(execution: Execution) -> int:
    """The ranks a layout shards its parameters and optimizer state over (DDP: none; only
    pipelines ask, and ZeRO-1 runs none)."""
    return 1 if execution.replicates_parameters else execution.shard


def _compute_alone(planned: Planned) -> float:
    assert planned.split is not None  # same_work keeps timed layouts only
    return planned.split.compute_alone_s
