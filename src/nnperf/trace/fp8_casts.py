"""What of each FP8 linear's operand Transformer Engine casts, as Megatron-LM runs it (and torchao's
float8 tensor parallelism, as torchtitan runs it).

The plan's FP8 linears (``passes.timing``'s FP8 GEMM) cast the 16-bit operand each GEMM brings
(the input in forward, the output gradient in backward) with per-tensor scaling. Traced with
the model's own linears and DTensor standing in for Megatron-Core's, two of those casts are not
the ones Megatron-LM runs:

- A sequence-parallel operand arrives through an all-gather over the tensor-parallel group.
  Transformer Engine quantizes the rank's shard and gathers the FP8 tensor
  (transformer_engine/pytorch/module/linear.py, ``_Linear.forward``: with ``sequence_parallel``
  and FP8 the local input is quantized, then ``gather_along_first_dim``; the output gradient
  likewise in ``grad_output_preprocess``): its cast covers 1 / tensor-parallel degree of the
  rows the GEMM reads.
- Megatron-Core fuses the query, key and value projections into one layer (``linear_qkv``) and
  a gated MLP's gate and up projections into one (``linear_fc1``), each casting its input once;
  a model written with separate linears reads one input in several FP8 GEMMs. The first such
  GEMM pays the cast, the others reuse it. Its experts' gate and up projections are one
  GroupedLinear too (``TEGroupedMLP``'s ``linear_fc1``), which runs in FP8 with the rest
  (``trace.config["fp8_experts"]``): the traced experts' two grouped GEMMs over one input
  (``aten._grouped_mm``, torchtitan's MoE layer) share its forward cast likewise (their
  backward operands, the two projections' output gradients, are two tensors here where TE
  casts one of both: ``passes.timing`` times the pair as one layer, ``trace.fused_expert_fc1``).

The gather itself then moves the FP8 tensor, one byte an element where DTensor's traced
all-gather moves the 16-bit one: Transformer Engine 1.x's ``LayerNormLinear`` normalizes
straight into FP8 (``ln_out`` of ``torch.uint8``) and calls ``gather_along_first_dim`` on it,
its ``grad_output_preprocess`` casts the local output gradient into a ``torch.uint8`` buffer and
gathers that; 2.x's ``gather_along_first_dim`` quantizes first and gathers FP8 for delayed and
current scaling alike (``_all_gather_fp8``). The reduce-scatters (a row-parallel layer's output,
a column-parallel one's input gradient) stay 16-bit: they sum.

torchtitan's sequence parallelism with float8 linears does the same: its ``apply_tp`` takes
torchao's float8 tensor-parallel styles (torchao/float8/float8_tensor_parallel.py):
``PrepareFloat8ModuleInput`` casts the attention's and the feed-forward's input shard to FP8 and
then gathers it, so wq, wk, wv (and w1, w3) share one cast of 1 / degree of the rows, and
``Float8RowwiseParallel`` casts wo's and w2's output gradient before the all-gather backward
makes of their reduce-scatter (``_NoopFwToFloat8BwDynamic`` after the redistribute); without
tensor parallelism each ``Float8Linear`` casts its own input, and nothing here applies. nnperf
takes these casts for every model with sequence parallelism outside Megatron-LM's layouts
(torchtitan's Llamas; its MoE parallelizers refuse float8 with tensor parallelism, and nnperf
plans a mixture of experts with tensor parallelism as Megatron-LM runs it).

``megatron_fp8_casts`` says, per FP8 GEMM, the share of its operand's cast it pays (GEMMs not
named pay all of it), and which tensor-parallel all-gathers carry an FP8 operand
(``in_fp8`` gives such a collective its FP8 bytes).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from nnperf.trace.collectives import Collective
from nnperf.trace.events import Trace
from nnperf.trace.fp8_saved_inputs import CARRIERS, MAX_CARRIED, runs_in_fp8
from nnperf.vocab import Phase

#: Bytes of one FP8 element (e4m3 or e5m2).
FP8_BYTES = 1


@dataclass(frozen=True)
class MegatronFp8Casts:
    """What Transformer Engine casts and gathers in FP8 on one traced rank."""

    #: FP8 GEMM event index -> the share of its operand's cast it pays (absent: all of it)
    shares: dict[int, float] = field(default_factory=dict)
    #: the tensor-parallel all-gathers (event indices) whose output an FP8 GEMM reads
    fp8_gathers: frozenset[int] = frozenset()


def in_fp8(collective: Collective, trace: Trace) -> Collective:
    """``collective``, an all-gather of ``MegatronFp8Casts.fp8_gathers``, with the bytes of its
    gathered tensor in FP8: its element count at one byte each."""
    gathered = trace.events[collective.index].outputs[0]
    return replace(collective, bytes=collective.bytes // gathered.itemsize * FP8_BYTES)


def megatron_fp8_casts(trace: Trace, gathers: frozenset[int], degree: int) -> MegatronFp8Casts:
    """Per FP8 GEMM event, the share of its operand's cast it pays: 0 for a forward operand an
    earlier FP8 GEMM cast already (nothing wrote it since), 1 / ``degree`` for one that comes
    from an all-gather at the event indices ``gathers`` (the tensor-parallel group's); and
    those all-gathers."""
    fp8_modules = set(trace.config.get("fp8_linears", ()))
    experts = bool(trace.config.get("fp8_experts"))
    if not fp8_modules and not experts:
        return MegatronFp8Casts()
    events, storages = trace.events, trace.storages

    def gather_of(storage: int) -> int | None:
        """The all-gather of ``gathers`` the storage carries the output of, if any."""
        for _ in range(MAX_CARRIED + 1):
            info = storages.get(storage)
            if info is None or info.created_by is None:
                return None
            maker = events[info.created_by]
            if maker.index in gathers:
                return maker.index
            if maker.name not in CARRIERS or not maker.inputs:
                return None
            storage = maker.inputs[0].storage
        return None

    shares: dict[int, float] = {}
    fp8_gathers: set[int] = set()
    # the forward operands cast already, by storage: (offset, shape, strides); forgotten when
    # anything writes the storage again
    cast: dict[int, set[tuple]] = {}
    for e in events:
        if not runs_in_fp8(e, fp8_modules, experts) or len(e.inputs) < 2:
            if e.name.endswith("_"):  # an in-place op (add_, copy_, allreduce_) writes its outputs
                for m in e.outputs:
                    cast.pop(m.storage, None)
            continue
        operands = e.inputs[1:] if e.name == "aten.addmm" else e.inputs  # addmm(bias, input, weight)
        # each operand's gather (the weight-gradient GEMM reads its input gathered again, in FP8 too)
        gathered = [gather_of(m.storage) for m in operands] if degree > 1 else []
        fp8_gathers.update(g for g in gathered if g is not None)
        operand = operands[0]  # the input in forward, the output's gradient in backward
        if e.phase == Phase.FORWARD or e.recomputed:  # a recomputed forward casts as the forward did
            seen = cast.setdefault(operand.storage, set())
            key = (operand.storage_offset, tuple(operand.shape), tuple(operand.stride))
            if key in seen:  # a fused layer's input, cast by the first of its GEMMs
                shares[e.index] = 0.0
                continue
            seen.add(key)
        if gathered and gathered[0] is not None:
            shares[e.index] = 1 / degree
    return MegatronFp8Casts(shares, frozenset(fp8_gathers))
