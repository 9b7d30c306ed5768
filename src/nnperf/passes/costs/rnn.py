"""cuDNN recurrent layers (``nnperf::cudnn_rnn`` and its backward, ``trace.rnn``), and packing.

FLOPs = the GEMMs cuDNN runs (``kernels.rnn.RnnGeometry.gemms``: the input projection of
every timestep at once, the recurrent and projection GEMMs step by step; backward data in
reverse plus the input gradient; backward weights over all tokens) + the fused gate
pointwise maths (``RnnGeometry.pointwise_flops``; the bias-gradient sums in backward).
MACs are the GEMMs'. Backward data always runs, so the input gradient of the first layer is
counted even when the input needs none, as cuDNN computes it ("unconditionally compute this
gradient, because it mutates reserve", ``aten/src/ATen/native/cudnn/RNN.cpp``).
Bytes: every tensor argument read once and every result written once (the reserve space
included: the gate activations backward reads back); per-step re-reads of the recurrent
weights are the time model's business.
"""

from __future__ import annotations

import nnperf.trace.rnn  # noqa: F401  (defines the nnperf:: ops registered below)
from nnperf.kernels.rnn import BACKWARD_DATA, BACKWARD_WEIGHTS, FORWARD, MODES, RnnGeometry
from nnperf.passes.costs.common import bind, listed, touched
from nnperf.passes.costs.matmul import GemmShape, register_shapes
from nnperf.passes.costs.registry import GEMM, MEMORY, OpCost, register
from nnperf.trace.events import OpEvent

FORWARD_OP = "nnperf.cudnn_rnn"
BACKWARD_OP = "nnperf.cudnn_rnn_backward"
RNN_OPS = (FORWARD_OP, BACKWARD_OP)


def geometry(event: OpEvent) -> RnnGeometry:
    """The RNN call an event records."""
    a = bind(event)
    x = a["input"]
    batch_sizes = [int(s) for s in a["batch_sizes"]]
    if batch_sizes:
        steps = tuple(batch_sizes)
    else:
        seq, batch = (x.shape[1], x.shape[0]) if a["batch_first"] else (x.shape[0], x.shape[1])
        steps = (batch,) * seq
    return RnnGeometry(
        cell=MODES[int(a["mode"])], input_size=x.shape[-1], hidden_size=int(a["hidden_size"]),
        proj_size=int(a["proj_size"]), num_layers=int(a["num_layers"]),
        bidirectional=bool(a["bidirectional"]), steps=steps, has_biases=bool(a["has_biases"]),
    )


def parts(event: OpEvent) -> tuple[str, ...]:
    """The cuDNN passes an event runs: forward; backward data (always) and weights (when a
    weight needs a gradient)."""
    if event.name == FORWARD_OP:
        return (FORWARD,)
    mask = bind(event)["output_mask"]
    return (BACKWARD_DATA, BACKWARD_WEIGHTS) if mask[3] else (BACKWARD_DATA,)


_ROLES = {FORWARD: "forward", BACKWARD_DATA: "grad_input", BACKWARD_WEIGHTS: "grad_weight"}


def _shapes(event: OpEvent) -> list[GemmShape]:
    g = geometry(event)
    return [GemmShape(x.m, x.n, x.k, role=_ROLES[part]) for part in parts(event) for x in g.gemms(part)]


register_shapes(FORWARD_OP, _shapes)
register_shapes(BACKWARD_OP, _shapes)


@register(FORWARD_OP, BACKWARD_OP)
def _rnn_cost(event: OpEvent) -> OpCost:
    g = geometry(event)
    ps = parts(event)
    gemm_flops = sum(g.gemm_flops(p) for p in ps)
    pointwise = sum(g.pointwise_flops(p) for p in ps)
    reads = [t for name, value in bind(event).items() if name != "output_mask" for t in listed(value)]
    return OpCost(
        GEMM,
        flops=gemm_flops + pointwise,
        macs=gemm_flops // 2,
        reads=reads,
        writes=event.outputs,
        info={"cell": g.cell, "gemm_flops": gemm_flops, "pointwise_flops": pointwise,
              "steps": len(g.steps), "layers": g.num_layers, "directions": g.directions},
    )


@register("aten._pack_padded_sequence")
def _pack_padded_sequence(event: OpEvent) -> OpCost:
    """Packing on real tensors (a ``--real`` trace; fake traces run its parts, ``trace.packing``):
    the running sequences' rows of the input copied once into the packed data."""
    data = event.outputs[0]
    return OpCost(MEMORY, reads=[touched(event.inputs[0], data.numel)], writes=[data])
