"""A data-parallel layout that cannot hold its model states, known from its FSDP sibling.

The search tries HSDP, DDP and ZeRO-1 only where FSDP of the same tensor/pipeline shape fits (they
hold at least FSDP's states with the same activations). Their own states follow from the FSDP
trace, so a layout whose parameters, gradients and optimizer state alone exceed the GPU is
rejected without a trace, whatever its checkpointing and micro-batch:

- FSDP2 shards each parameter's rank-local tensor (after tensor parallelism) by rows: rank 0
  holds the first ``ceil(d / S)`` of its ``d`` rows over a shard group of ``S`` (padded
  storage of that size; DDP: ``S = 1``). With ``L`` those bytes and ``r`` one row's bytes,
  ``d >= S (ceil(d / S) - 1) + 1``, so on ``S' = S / m`` ranks rank 0 holds
  ``ceil(d / S') r >= m (L - r)`` bytes.
- Gradients are shaped like their parameters (FSDP2's sharded gradient, DDP's bucket view),
  and the optimizer keeps per-parameter tensors shaped like it (``MIRRORS``: Adam's two
  moments, ``torch.zeros_like(p)``; SGD's momentum buffer, a clone of the gradient) besides
  scalars (Adam's step). Used only when the FSDP trace shows it: gradient bytes equal the
  parameter bytes and optimizer-state bytes are at least ``MIRRORS`` times them.
- All of them are alive together at the optimizer step, so rank 0's memory is at least
  ``m (2 + MIRRORS) (P - R)``: ``P`` the FSDP rank's parameter bytes, ``R`` the sum of its
  parameters' row bytes (``param_row_bytes``), both exact per block at any depth.
- ZeRO-1 (DDP with the optimizer state sharded over its ``m`` ranks, Megatron-LM's distributed
  optimizer: ``trace.parallel.distributed_optimizer``) holds the whole parameters and gradients,
  at least ``m (P - R)`` bytes each, and its even share of the state, ``MIRRORS`` times the
  whole parameters over ``m``: at least ``(2 m + MIRRORS) (P - R)``.
- With expert parallelism ``ep`` (the sibling's experts sharded over its whole shard group, a
  DDP / ZeRO-1 rank's over the expert group only) a rank holds its dense parameters whole and
  ``1 / ep`` of the experts: at least ``1 / ep`` of the whole, so ``m`` is ``S / ep``; ZeRO-1's
  share of the state is still at least the sibling's (the experts' over ``dp / ep`` ranks).
"""

from __future__ import annotations

from nnperf.layout import Execution
from nnperf.search.plan.results import Planned, StateBytes
from nnperf.trace.events import Trace

#: Per-parameter optimizer tensors shaped like the parameter, by ``TraceOptions.optimizer``.
MIRRORS = {"adamw": 2, "adam": 2, "sgd-momentum": 1, "sgd": 0}

WHAT = "its parameters, gradients and optimizer state alone (whatever its checkpointing and micro-batch)"


def param_row_bytes(trace: Trace) -> float:
    """The bytes of one row (along dimension 0) of each parameter's local storage, summed."""
    total = 0.0
    for sid, name in trace.param_storages.items():
        shape = trace.param_shapes.get(name, ())
        rows = shape[0] if shape else 1
        total += trace.storages[sid].nbytes / rows if rows else 0.0
    return total


def states_bound(sibling: Planned, shard: int, execution: Execution, optimizer: str) -> int | None:
    """The lower bound (bytes) of ``execution``'s memory from ``sibling``, the planned FSDP
    layout of the same shape over ``shard`` ranks; None where the module docstring's
    conditions do not hold."""
    if execution.optimizer_states != "fp32":  # less than FSDP's own optimizer may keep
        return None
    mirrors = MIRRORS.get(optimizer)
    states = sibling.state_bytes or StateBytes()
    # whole bytes, as the plan reports them (an extrapolated figure is a float)
    params, gradients, optimizer_state = (round(states.parameters), round(states.gradients),
                                          round(states.optimizer_state))
    own_shard = 1 if execution.replicates_parameters else execution.shard
    if execution.replicates_parameters and execution.expert > 1:  # module docstring
        own_shard *= execution.expert
    if (mirrors is None or not params or gradients != params
            or optimizer_state < mirrors * params or shard % own_shard):
        return None
    m, least = shard // own_shard, max(0.0, params - sibling.param_row_bytes)
    if execution.shards_optimizer_only:  # whole parameters and gradients, an even share of the state
        return int((2 * m + mirrors) * least)
    return int(m * (2 + mirrors) * least)
