"""Which storages FSDP2 allocates on its side streams (``passes.memory.model.side_streams``),
against its all-gather buffers and reduce-scatter outputs sized by hand. Traces one small FSDP2
rank (seconds)."""

from __future__ import annotations

from nnperf.layout import Execution
from nnperf.passes.fsdp_streams import COPY_IN_STREAM, REDUCE_SCATTER_STREAM
from nnperf.passes.memory.model import allocation_program, side_streams
from nnperf.trace.distributed import trace_rank
from nnperf.trace.options import TraceOptions
from nnperf.zoo import get_model

DIM, FFN, SHARDS = 128, 256, 4
LLAMA = {"n_layer": 2, "dim": DIM, "n_heads": 4, "ffn_hidden": FFN, "vocab": 512}
#: a block's parameters: four attention projections, three FFN projections, two norms
BLOCK = 4 * DIM * DIM + 3 * DIM * FFN + 2 * DIM
#: the root's: the embedding, the output projection and the final norm
ROOT = 2 * LLAMA["vocab"] * DIM + DIM


def _traced():
    return trace_rank(lambda: get_model("llama-7b").build(batch=2, seq_len=64, **LLAMA), TraceOptions(amp="bf16"),
                      Execution(world=SHARDS, data="fsdp", shard=SHARDS, micro_batch=2),
                      lambda model: [f"layers.{i}" for i in range(LLAMA["n_layer"])]).trace


def test_fsdp2s_gathers_and_reduce_scatter_outputs_are_on_its_side_streams():
    """Each block is gathered in bf16 on the all-gather copy-in stream, from a bf16 copy of its
    shard made there, in forward and again before its backward (reshard after forward); the
    root (embedding, final norm, output) once. Each gradient is reduce-scattered in fp32 into a
    shard allocated on the reduce-scatter stream. No parameter is on a side stream."""
    trace = _traced()
    streams = side_streams(trace)

    def sizes(stream: object) -> list[int]:
        return sorted(trace.storages[s].nbytes for s, on in streams.items() if on == stream)

    gathered = [ROOT * 2, ROOT * 2 // SHARDS] + [BLOCK * 2, BLOCK * 2 // SHARDS] * 4
    assert sizes(COPY_IN_STREAM) == sorted(gathered)
    assert sizes(REDUCE_SCATTER_STREAM) == sorted([BLOCK // SHARDS * 4] * 2 + [ROOT // SHARDS * 4])
    assert not set(trace.param_storages) & set(streams)


def test_a_side_streams_buffers_are_cached_apart_from_the_compute_streams():
    """Replayed with its side streams, the step reserves at least what it reserves on one
    stream: what the side streams cache cannot be reused by activations."""
    trace = _traced()
    program = allocation_program(trace)
    assert program.streams == side_streams(trace)
    one_stream = type(program)(program.ops, program.roles)
    assert program.peaks()[1] > one_stream.peaks()[1]
    assert program.peaks()[0] == one_stream.peaks()[0]  # the same tensors, the same allocated bytes
