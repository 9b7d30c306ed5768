"""Tensor creation: fills, ranges, random numbers, bare allocations, and dropout.

Fills and ranges write their result and read nothing (``zeros_like(x)`` only looks at
``x``'s shape). Random generators also only write; each generated value is counted as
``RNG_FLOPS`` nominal FLOPs (Philox draws are integer work and the kernels are store-bound,
so the count exists to make RNG visible, not to be exact). ``empty``-style ops only reserve
memory: category ALLOC, no kernel, no bytes.

Dropout (``native_dropout``) draws, compares and scales each element in one kernel, and
writes both the output and the boolean mask.
"""

from __future__ import annotations

from nnperf.passes.costs.common import bind, distinct, footprint, overload, read_args
from nnperf.passes.costs.registry import (
    ALLOC,
    ELEMENTWISE,
    MEMORY,
    OpCost,
    register,
    written_args,
)
from nnperf.trace.events import OpEvent

RNG_FLOPS = 1
DROPOUT_FLOPS = 3  # draw, compare with p, scale by 1 / (1 - p)

FILLS = (
    "aten.zeros",
    "aten.ones",
    "aten.full",
    "aten.zeros_like",
    "aten.ones_like",
    "aten.full_like",
    "aten.new_zeros",
    "aten.new_ones",
    "aten.new_full",
    "aten.fill",
    "aten.fill_",
    "aten.zero_",
    "aten.zero",
    "aten.arange",
    "aten.linspace",
    "aten.logspace",
    "aten.eye",
    "aten.scalar_tensor",
    "aten.tril_indices",
    "aten.triu_indices",
)
RANDOM = (
    "aten.rand",
    "aten.randn",
    "aten.randint",
    "aten.randperm",
    "aten.rand_like",
    "aten.randn_like",
    "aten.randint_like",
    "aten.normal",
    "aten.normal_",
    "aten.uniform",
    "aten.uniform_",
    "aten.bernoulli",
    "aten.bernoulli_",
    "aten.random_",
    "aten.exponential_",
    "aten.cauchy_",
    "aten.log_normal_",
    "aten.geometric_",
)
ALLOCATIONS = (
    "aten.empty",
    "aten.empty_like",
    "aten.new_empty",
    "aten.new_empty_strided",
    "aten.empty_strided",
    "aten.empty_permuted",
)


def _generated(event: OpEvent):
    written = written_args(event)
    return distinct(written or event.outputs)


def _value_inputs(event: OpEvent):
    """Tensors whose *values* a creation op reads: ``fill_(x, value_tensor)``, the
    probabilities of ``bernoulli(p)``, the mean/std of ``normal`` - never the tensor that
    only lends its shape (``self`` of ``zeros_like`` or of an in-place fill)."""
    args = bind(event)
    reads = [footprint(t) for t in read_args(event)]
    self_ = args.get("self")
    reads_self = event.name == "aten.bernoulli" and overload(event) in ("default", "out")
    if self_ is not None and not reads_self:
        reads = [t for t in reads if t.storage != self_.storage]
    return distinct(reads)


@register(*FILLS)
def _fill(event: OpEvent) -> OpCost:
    return OpCost(MEMORY, reads=_value_inputs(event), writes=_generated(event))


@register(*RANDOM)
def _random(event: OpEvent) -> OpCost:
    writes = _generated(event)
    return OpCost(
        MEMORY,
        flops=float(RNG_FLOPS * sum(t.numel for t in writes)),
        reads=_value_inputs(event),
        writes=writes,
        info={"rng": True},
    )


@register(*ALLOCATIONS)
def allocation(event: OpEvent) -> OpCost:
    """The buffer the op's outputs take: no kernel (also what ``passes.count`` counts a copy
    the modelled framework does not make as)."""
    return OpCost(ALLOC, info={"allocates": sum(t.nbytes for t in event.outputs)})


@register("aten.native_dropout")
def _native_dropout(event: OpEvent) -> OpCost:
    x = bind(event)["input"]
    return OpCost(
        ELEMENTWISE,
        flops=float(DROPOUT_FLOPS * x.numel),
        reads=[footprint(x)],
        writes=distinct(event.outputs),
        info={"rng": True},
    )
