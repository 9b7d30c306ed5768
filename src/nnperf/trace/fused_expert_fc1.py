"""Megatron-Core's experts' gate and up projections are one layer: Transformer Engine's
``linear_fc1``, one GEMM an expert where the traced experts run two.

Megatron-Core's ``TEGroupedMLP`` (megatron/core/transformer/moe/experts.py) builds a gated
expert's first layer as one ``GroupedLinear`` of twice the expert's hidden width
(``ffn_hidden_size * 2`` when ``gated_linear_unit``) and splits its output for the activation;
Transformer Engine runs it as one GEMM per expert in each pass (module/grouped_linear.py:
``general_grouped_gemm`` over the experts' inputs and weights). The traced stand-in
(torchtitan's MoE layer: ``aten._grouped_mm`` over the routed tokens with the gate's weights,
then again with the up projection's) runs two grouped GEMMs where Megatron-LM runs one:

- forward: two GEMMs over one input, each expert's ``tokens x hidden x dim``, where TE runs
  ``tokens x 2 hidden x dim``;
- input gradient: two GEMMs, each contracting its own output gradient over ``hidden``, and an
  add of the two results, where TE contracts the fused output gradient over ``2 hidden`` and
  writes the sum itself;
- weight gradient: two GEMMs over one saved input, where TE makes the ``2 hidden x dim``
  gradient in one.

``fused_expert_fc1`` finds those groups in a traced step: each group's GEMMs (its first one
times the group: ``passes.timing``) and the adds that only sum a group's input gradients, which
TE does not run. The FLOPs and bytes stay the traced ones; dense layers keep their own linears.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from nnperf.trace.events import OpEvent, TensorMeta, Trace
from nnperf.trace.fp8_saved_inputs import EXPERT_GEMMS
from nnperf.vocab import Phase

#: The adds that sum two input gradients (autograd's accumulation of a tensor's gradient).
SUMS = frozenset({"aten.add", "aten.add_"})


@dataclass(frozen=True)
class FusedLinears:
    """The traced GEMMs Transformer Engine runs as one, in a traced step."""

    #: first GEMM's event index -> the group's event indices, in trace order (the first included)
    groups: dict[int, tuple[int, ...]] = field(default_factory=dict)
    #: adds that only sum a group's input gradients (the fused GEMM writes the sum): the add's
    #: event index -> the group's first GEMM
    sums: dict[int, int] = field(default_factory=dict)


def _view(m: TensorMeta) -> tuple:
    return m.storage, m.storage_offset, tuple(m.shape), tuple(m.stride)


def fused_expert_fc1(trace: Trace) -> FusedLinears:
    """The experts' gate and up projections' GEMMs, grouped as Megatron-Core's ``linear_fc1``
    runs them (see the module docstring)."""
    forward: dict[tuple, list[int]] = defaultdict(list)
    weight_grads: dict[tuple, list[int]] = defaultdict(list)
    input_grads: dict[int, int] = {}  # output storage -> the input-gradient GEMM writing it
    for e in trace.events:
        if e.name not in EXPERT_GEMMS or len(e.inputs) < 2 or not e.outputs:
            continue
        a, b, out = e.inputs[0], e.inputs[1], e.outputs[0]
        if len(out.shape) == 3:  # an expert-stacked weight gradient: reads the saved input as b
            weight_grads[(e.phase, _view(b))].append(e.index)
        elif len(b.shape) == 3:  # routed rows times the experts' weights
            if e.phase == Phase.FORWARD or e.recomputed:
                # the same rows, split among the experts by the same offsets
                offsets = _view(e.inputs[2]) if len(e.inputs) > 2 else None
                forward[(e.phase, _view(a), offsets)].append(e.index)
            else:
                input_grads[out.storage] = e.index
    groups: dict[int, tuple[int, ...]] = {}
    for members in (*forward.values(), *weight_grads.values()):
        if len(members) > 1:
            groups[members[0]] = tuple(members)
    sums: dict[int, int] = {}
    for e in trace.events:
        if e.name in SUMS and e.phase != Phase.FORWARD and _sums_two_input_gradients(e, input_grads):
            members = tuple(sorted(input_grads[m.storage] for m in e.inputs))
            groups[members[0]] = members
            sums[e.index] = members[0]
    return FusedLinears(groups, sums)


def _sums_two_input_gradients(e: OpEvent, input_grads: dict[int, int]) -> bool:
    """An add of exactly two experts' input gradients, written by two different GEMMs."""
    if len(e.inputs) != 2 or e.kwargs.get("alpha", 1) != 1:  # a plain sum
        return False
    writers = {input_grads.get(m.storage) for m in e.inputs}
    return None not in writers and len(writers) == 2
