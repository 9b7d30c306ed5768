"""Transformer Engine's FP8 linears keep their input for backward in FP8: one byte an element.

Transformer Engine's ``Linear`` and ``LayerNormLinear`` (transformer_engine/pytorch/module/
linear.py, ``_Linear.forward``: ``saved_inputmat = inputmat`` or ``saved_inputmat_t =
inputmat_t`` when FP8 runs the weight-gradient GEMM) save the FP8 cast of their input, not the
16-bit input; under sequence parallelism the rank's FP8 shard, gathered again in backward. The
16-bit input then lives only while something else needs it: until its last forward reader.
Its ``GroupedLinear`` (module/grouped_linear.py: the quantized ``inputmats``, column-wise usage
only, in ``save_for_backward``) does the same for a mixture of experts' GEMMs
(``aten._grouped_mm`` here), which Megatron-LM's layouts run in FP8 (``trace.config
["fp8_experts"]``): the experts' input and their down projection's input.

Where another op keeps the 16-bit input for its own backward anyway, Megatron-Core asks the
linear to save that original instead (``set_save_original_input``, Transformer Engine 2.6 and
later, refused under delayed scaling: megatron/core/transformer/attention.py for
``linear_proj``, whose input the attention keeps, and which it asks whether or not the
attention is recomputed; moe_layer.py and shared_experts.py for the shared experts'
``linear_fc1``, whose input the router keeps): no FP8 copy is held, the forward cast writes
row-wise data only, and backward casts the saved original again, column-wise, for the weight
gradient, once a layer (``_Linear.forward``: ``input_quantizer.set_usage(columnwise=False)``
when ``save_original_input``). nnperf plans per-tensor current scaling, where that holds (runs
of Transformer Engine 1.x or with delayed scaling held the output projection's FP8 copy too).

torchao's float8 linears, torchtitan's, save the 16-bit input and cast it again in backward
(torchao/float8/float8_linear.py, ``matmul_with_hp_or_float8_args``:
``ctx.save_for_backward(input_hp, weight_hp_t)``): the trace's own lifetimes, left as they are.

``keep_fp8_saved_inputs`` rewrites a traced step as Transformer Engine runs it. For each 16-bit
storage made in forward, kept for backward and read by an FP8 GEMM in forward (directly, or
through the all-gather of sequence parallelism):

- when only FP8 GEMMs and all-gathers (views aside) read it in backward: one storage of one
  byte per element, made at its first such reader, freed where the 16-bit one was, and the
  16-bit storage freed after its last forward reader;
- when another op reads it in backward too, or it is an attention kernel's output: nothing
  held beside it; the GEMMs casting it are named (``Fp8SavedInputs``) for ``passes.timing``.

The GEMMs keep their traced tensors and bytes (the gathers' FP8 bytes and the casts' shares:
``trace.fp8_casts``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from nnperf.kernels.grouped_gemm import GROUPED_MM
from nnperf.trace.collectives import COLLECTIVES
from nnperf.trace.events import OpEvent, StorageInfo, Trace
from nnperf.vocab import Phase

#: The ops a linear layer's GEMMs trace as (``F.linear`` decomposes into them).
LINEAR_GEMMS = frozenset({"aten.mm", "aten.addmm"})
#: The op a mixture of experts' GEMMs trace as (the planner's and torchtitan's MoE layers).
EXPERT_GEMMS = frozenset({GROUPED_MM})
#: Ops that carry a linear's input to its GEMM unchanged in value: sequence parallelism's
#: all-gather, the wait on it, and the reordering of the gathered shards.
CARRIERS = frozenset({"_c10d_functional.wait_tensor", "aten.cat"})
#: Storages this far (in carrying ops) from an FP8 GEMM still count as its input.
MAX_CARRIED = 3
#: The attention kernels whose output Megatron-Core's output projection (``linear_proj``) saves
#: as it is, whether the attention keeps it or recomputes it (attention.py sets
#: ``save_original_input`` on every FP8 run that is not delayed scaling).
ATTENTION_KERNELS = frozenset({
    "nnperf.attention", "aten._scaled_dot_product_flash_attention",
    "aten._scaled_dot_product_efficient_attention", "aten._scaled_dot_product_cudnn_attention",
    "higher_order.flex_attention",
})
#: Ops that only lay a tensor out again on the way from the attention to the projection.
_RELAYOUTS = frozenset({"aten.clone", "aten._unsafe_view", "aten._to_copy"})
_FP8_BYTES = 1


def runs_in_fp8(e: OpEvent, fp8_modules: set[str], experts: bool) -> bool:
    """Event ``e`` is a GEMM Transformer Engine runs in FP8: a linear of ``fp8_modules``, or
    an expert's grouped GEMM where ``experts`` (``trace.config["fp8_experts"]``)."""
    return (e.module in fp8_modules and e.name in LINEAR_GEMMS) or (experts and e.name in EXPERT_GEMMS)


@dataclass(frozen=True)
class Fp8SavedInputs:
    """How a traced step's FP8 GEMMs keep their inputs for backward (``keep_fp8_saved_inputs``)."""

    #: FP8 copies held in place of 16-bit inputs
    copies: int = 0
    #: backward FP8 GEMMs (event indices) that cast a saved 16-bit original again, column-wise:
    #: how many elements each casts
    recast: dict[int, int] = field(default_factory=dict)
    #: forward FP8 GEMMs (event indices) whose input cast writes row-wise data only (the original
    #: is saved instead of the column-wise FP8 copy)
    rowwise_only: frozenset[int] = frozenset()


def keep_fp8_saved_inputs(trace: Trace, experts: bool = False) -> Fp8SavedInputs:
    """Rewrite ``trace`` (see the module docstring), with the experts' grouped GEMMs in FP8 too
    where ``experts``."""
    fp8_modules = set(trace.config.get("fp8_linears", ()))
    if (not fp8_modules and not experts) or trace.mode != "train":
        return Fp8SavedInputs()
    events, storages, params = trace.events, trace.storages, set(trace.param_storages)
    readers: dict[int, list[int]] = defaultdict(list)
    for e in events:
        for m in e.inputs:
            if not readers[m.storage] or readers[m.storage][-1] != e.index:
                readers[m.storage].append(e.index)

    def fp8_gemm(index: int) -> bool:
        return runs_in_fp8(events[index], fp8_modules, experts)

    def gathers(index: int) -> bool:
        spec = COLLECTIVES.get(events[index].name)
        return spec is not None and spec[0] == "all_gather"

    def fed_gemms(sid: int, phase: str, depth: int = 0) -> dict[int, int]:
        """The FP8 GEMMs of ``phase`` reading storage ``sid`` (or what carrying ops made of it):
        event index -> elements read from it."""
        fed: dict[int, int] = {}
        for i in readers.get(sid, ()):
            e = events[i]
            if (e.phase == Phase.FORWARD) != (phase == Phase.FORWARD):
                continue
            if fp8_gemm(i):
                fed[i] = max(m.numel for m in e.inputs if m.storage == sid)
            elif depth < MAX_CARRIED and (gathers(i) or e.free or e.name in CARRIERS):
                for m in e.outputs:
                    if m.storage != sid:
                        fed.update(fed_gemms(m.storage, phase, depth + 1))
        return fed

    def attention_output(sid: int, depth: int = 0) -> bool:
        """Storage ``sid`` is an attention kernel's output (or a relayout of it)."""
        info = storages.get(sid)
        if info is None or info.created_by is None:
            return False
        maker = events[info.created_by]
        if maker.name in ATTENTION_KERNELS:
            return True
        return (depth < MAX_CARRIED and bool(maker.inputs) and (maker.free or maker.name in _RELAYOUTS)
                and attention_output(maker.inputs[0].storage, depth + 1))

    next_id = max(storages, default=-1) + 1
    copies = 0
    recast: dict[int, int] = {}
    rowwise_only: set[int] = set()
    for sid, info in list(storages.items()):
        created, released = info.created_by, info.released_after
        if (sid in params or created is None or released is None or events[created].phase != Phase.FORWARD
                or events[released].phase != Phase.BACKWARD):
            continue
        metas = [m for i in readers.get(sid, ()) for m in events[i].inputs if m.storage == sid]
        forward_gemms = fed_gemms(sid, Phase.FORWARD)
        if not metas or any(m.itemsize != 2 for m in metas) or not forward_gemms:
            continue
        forward = [i for i in readers[sid] if events[i].phase == Phase.FORWARD]
        backward = [i for i in readers[sid] if events[i].phase != Phase.FORWARD and not events[i].free]
        if attention_output(sid) or not all(fp8_gemm(i) or gathers(i) for i in backward):
            # saved as it is (kept anyway, or the output projection's input): no copy; the
            # layer's first weight-gradient GEMM casts it again (a fused layer's members share it)
            backward_gemms = fed_gemms(sid, Phase.BACKWARD)
            if backward_gemms:
                first = min(backward_gemms)
                recast[first] = backward_gemms[first]
            rowwise_only.update(forward_gemms)
            continue
        elements = max(m.numel for m in metas)
        storages[next_id] = StorageInfo(elements * _FP8_BYTES, info.kind, forward[0], released)
        events[forward[0]].allocates.append(next_id)
        events[released].releases.append(next_id)
        next_id += 1
        copies += 1
        if all(fp8_gemm(i) or gathers(i) for i in backward):
            events[released].releases.remove(sid)
            info.released_after = forward[-1]
            events[forward[-1]].releases.append(sid)
    return Fp8SavedInputs(copies, recast, frozenset(rowwise_only))
