"""Transformer Engine's FP8 linears keep their input for backward in FP8: one byte an element.

Transformer Engine's ``Linear`` and ``LayerNormLinear`` (transformer_engine/pytorch/module/
linear.py, ``_Linear.forward``: ``saved_inputmat = inputmat`` or ``saved_inputmat_t =
inputmat_t`` when FP8 runs the weight-gradient GEMM) save the FP8 cast of their input, not the
16-bit input; under sequence parallelism the rank's FP8 shard, gathered again in backward. The
16-bit input then lives only while something else needs it: until its last forward reader,
unless another op saved it too (the attention keeps its output for its own backward, and
Transformer Engine's FP8 copy lives beside it). Megatron-LM's layouts run these layers.

torchao's float8 linears, torchtitan's, save the 16-bit input and cast it again in backward
(torchao/float8/float8_linear.py, ``matmul_with_hp_or_float8_args``:
``ctx.save_for_backward(input_hp, weight_hp_t)``): the trace's own lifetimes, left as they are.

``keep_fp8_saved_inputs`` rewrites a traced step as Transformer Engine runs it. For each 16-bit
storage made in forward, kept for backward and read by an FP8 linear's forward GEMM (directly,
or through the all-gather of sequence parallelism):

- one storage of one byte per element, made at its first such reader, freed where the 16-bit
  one was;
- the 16-bit storage freed after its last forward reader, when nothing but FP8 linears' GEMMs
  and all-gathers (views aside) read it in backward.

Only memory changes here: the GEMMs and casts keep their traced tensors and bytes (the
gathers' FP8 bytes and the casts' shares: ``trace.fp8_casts``).
"""

from __future__ import annotations

from collections import defaultdict

from nnperf.trace.collectives import COLLECTIVES
from nnperf.trace.events import StorageInfo, Trace
from nnperf.vocab import Phase

#: The ops a linear layer's GEMMs trace as (``F.linear`` decomposes into them).
LINEAR_GEMMS = frozenset({"aten.mm", "aten.addmm"})
#: Ops that carry a linear's input to its GEMM unchanged in value: sequence parallelism's
#: all-gather, the wait on it, and the reordering of the gathered shards.
CARRIERS = frozenset({"_c10d_functional.wait_tensor", "aten.cat"})
#: Storages this far (in carrying ops) from an FP8 GEMM still count as its input.
MAX_CARRIED = 3
_FP8_BYTES = 1


def keep_fp8_saved_inputs(trace: Trace) -> int:
    """Rewrite ``trace`` (see the module docstring); returns how many FP8 copies it holds."""
    fp8_modules = set(trace.config.get("fp8_linears", ()))
    if not fp8_modules or trace.mode != "train":
        return 0
    events, storages, params = trace.events, trace.storages, set(trace.param_storages)
    readers: dict[int, list[int]] = defaultdict(list)
    for e in events:
        for m in e.inputs:
            if not readers[m.storage] or readers[m.storage][-1] != e.index:
                readers[m.storage].append(e.index)

    def fp8_gemm(index: int) -> bool:
        e = events[index]
        return e.module in fp8_modules and e.name in LINEAR_GEMMS

    def gathers(index: int) -> bool:
        spec = COLLECTIVES.get(events[index].name)
        return spec is not None and spec[0] == "all_gather"

    def feeds_fp8_gemm(sid: int, phase: str, depth: int = 0) -> bool:
        for i in readers.get(sid, ()):
            e = events[i]
            if e.phase != phase:
                continue
            if fp8_gemm(i):
                return True
            if depth < MAX_CARRIED and (gathers(i) or e.free or e.name in CARRIERS) and any(
                    feeds_fp8_gemm(m.storage, phase, depth + 1) for m in e.outputs if m.storage != sid):
                return True
        return False

    next_id = max(storages, default=-1) + 1
    copies = 0
    for sid, info in list(storages.items()):
        created, released = info.created_by, info.released_after
        if (sid in params or created is None or released is None or events[created].phase != Phase.FORWARD
                or events[released].phase != Phase.BACKWARD):
            continue
        metas = [m for i in readers.get(sid, ()) for m in events[i].inputs if m.storage == sid]
        if not metas or any(m.itemsize != 2 for m in metas) or not feeds_fp8_gemm(sid, Phase.FORWARD):
            continue
        forward = [i for i in readers[sid] if events[i].phase == Phase.FORWARD]
        backward = [i for i in readers[sid] if events[i].phase != Phase.FORWARD and not events[i].free]
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
    return copies

