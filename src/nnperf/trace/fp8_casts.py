"""What of each FP8 linear's operand Transformer Engine casts, as Megatron-LM runs it.

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
  GEMM pays the cast, the others reuse it.

``megatron_fp8_casts`` says, per FP8 GEMM, the share of its operand's cast it pays (GEMMs not
named pay all of it). Only cast time changes: the all-gather keeps its traced 16-bit bytes
(with --tp-comm-overlap, Transformer Engine's userbuffers hide it behind the GEMM).
"""

from __future__ import annotations

from nnperf.trace.events import Trace
from nnperf.trace.fp8_saved_inputs import CARRIERS, LINEAR_GEMMS, MAX_CARRIED
from nnperf.vocab import Phase


def megatron_fp8_casts(trace: Trace, gathers: frozenset[int], degree: int) -> dict[int, float]:
    """FP8 GEMM event index -> the share of its operand's cast it pays: 0 for a forward operand
    an earlier FP8 GEMM cast already (nothing wrote it since), 1 / ``degree`` for one that comes
    from an all-gather at the event indices ``gathers`` (the tensor-parallel group's)."""
    fp8_modules = set(trace.config.get("fp8_linears", ()))
    if not fp8_modules:
        return {}
    events, storages = trace.events, trace.storages

    def gathered(storage: int) -> bool:
        for _ in range(MAX_CARRIED + 1):
            info = storages.get(storage)
            if info is None or info.created_by is None:
                return False
            maker = events[info.created_by]
            if maker.index in gathers:
                return True
            if maker.name not in CARRIERS or not maker.inputs:
                return False
            storage = maker.inputs[0].storage
        return False

    shares: dict[int, float] = {}
    # the forward operands cast already, by storage: (offset, shape, strides); forgotten when
    # anything writes the storage again
    cast: dict[int, set[tuple]] = {}
    for e in events:
        if e.module not in fp8_modules or e.name not in LINEAR_GEMMS or not e.inputs:
            if e.name.endswith("_"):  # an in-place op (add_, copy_, allreduce_) writes its outputs
                for m in e.outputs:
                    cast.pop(m.storage, None)
            continue
        operand = e.inputs[0]
        if e.phase == Phase.FORWARD:
            seen = cast.setdefault(operand.storage, set())
            key = (operand.storage_offset, tuple(operand.shape), tuple(operand.stride))
            if key in seen:  # a fused layer's input, cast by the first of its GEMMs
                shares[e.index] = 0.0
                continue
            seen.add(key)
        if degree > 1 and gathered(operand.storage):
            shares[e.index] = 1 / degree
    return shares
