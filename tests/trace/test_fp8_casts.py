"""Megatron-LM's FP8 linears cast what Transformer Engine casts (``trace.fp8_casts``): a
sequence-parallel operand on the rank's shard before its all-gather, and the input of the
fused q-k-v and gate-up layers once; torchtitan's with torchao's float8 tensor-parallel styles
likewise. Each share and each cast's bytes counted by hand from the tiny Llama's separate wq,
wk, wv and w1, w3 (Megatron-Core's linear_qkv and linear_fc1). Traces tiny ranks (seconds)."""

from __future__ import annotations

import pytest

from nnperf.hardware.catalog import load_gpu
from nnperf.hardware.profile import default_profile
from nnperf.layout import Execution
from nnperf.passes.count import count_ops
from nnperf.passes.timing import KernelModel
from nnperf.trace.distributed import trace_rank
from nnperf.trace.options import TraceOptions

LLAMA = {"n_layer": 2, "dim": 32, "n_heads": 4, "n_kv_heads": 4, "ffn_hidden": 48, "vocab": 101}
BATCH, SEQ, TP = 2, 16, 2


def _trace(execution: Execution):
    from nnperf.zoo import get_model

    return trace_rank(lambda: get_model("llama-7b").build(batch=BATCH, seq_len=SEQ, **LLAMA),
                      TraceOptions(optimizer="adamw", dtype="bf16", fp8=True), execution, lambda model: [])


def _shares(traced) -> dict[tuple[str, str], list[float]]:
    events, shares = traced.trace.events, traced.trace.config.get("fp8_cast_shares", {})
    out: dict[tuple[str, str], list[float]] = {}
    for index, share in shares.items():
        e = events[index]
        out.setdefault((str(e.phase), e.module.split(".")[-1]), []).append(share)
    return out


def test_a_sequence_parallel_shard_is_cast_before_its_gather_and_a_fused_input_once():
    execution = Execution(world=2 * TP, data="zero1", tensor=TP, sequence_parallel=True, micro_batch=BATCH)
    shares = _shares(_trace(execution))
    layers = LLAMA["n_layer"]
    # forward: the gathered norm outputs, cast once per fused layer on the shard
    assert shares[("forward", "wq")] == shares[("forward", "w1")] == [1 / TP] * layers
    assert shares[("forward", "wk")] == shares[("forward", "wv")] == shares[("forward", "w3")] == [0.0] * layers
    # backward: the row-parallel layers' output gradients arrive gathered (their input- and
    # weight-gradient GEMMs read them); the column-parallel ones' are the rank's own
    assert shares[("backward", "wo")] == shares[("backward", "w2")] == [1 / TP] * (2 * layers)
    assert {k for k in shares} == {("forward", m) for m in ("wq", "wk", "wv", "w1", "w3")} | {
        ("backward", "wo"), ("backward", "w2")}


def test_without_tensor_parallelism_only_the_fused_inputs_change():
    shares = _shares(_trace(Execution(world=2, data="zero1", micro_batch=BATCH)))
    assert set(shares) == {("forward", m) for m in ("wk", "wv", "w3")}
    assert all(s == [0.0] * LLAMA["n_layer"] for s in shares.values())


def test_torchtitans_float8_casts_every_linear_input():
    traced = _trace(Execution(world=2, data="fsdp", shard=2, micro_batch=BATCH))
    assert "fp8_cast_shares" not in traced.trace.config


def test_torchtitans_float8_tensor_parallelism_casts_a_modules_input_shard_once():
    """torchtitan's apply_tp with float8 takes torchao's PrepareFloat8ModuleInput for the
    attention's and the feed-forward's input (cast on the shard, then gathered: once for wq,
    wk, wv and once for w1, w3) and Float8RowwiseParallel for wo and w2 (their output's gradient
    cast before the all-gather backward makes of the forward's reduce-scatter): the shares
    Transformer Engine's give, on FSDP2 beside the tensor parallelism."""
    execution = Execution(world=2 * TP, data="fsdp", shard=2, tensor=TP, sequence_parallel=True, micro_batch=BATCH)
    shares = _shares(_trace(execution))
    layers = LLAMA["n_layer"]
    assert shares[("forward", "wq")] == shares[("forward", "w1")] == [1 / TP] * layers
    assert shares[("forward", "wk")] == shares[("forward", "wv")] == shares[("forward", "w3")] == [0.0] * layers
    assert shares[("backward", "wo")] == shares[("backward", "w2")] == [1 / TP] * (2 * layers)
    assert len(shares) == 7


def test_torchtitans_float8_gathers_move_one_byte_an_element():
    """The blocks' tensor-parallel all-gathers carry FP8: each sublayer's input in forward and
    its row-parallel layer's output gradient in backward, (tokens, dim) at one byte; the head's
    input (``output`` is no float8 linear: torchtitan keeps it 16-bit) and the embedding
    output's gradient keep two bytes. FSDP2's gathers are not touched."""
    execution = Execution(world=2 * TP, data="fsdp", shard=2, tensor=TP, sequence_parallel=True, micro_batch=BATCH)
    traced = _trace(execution)
    tokens, dim, layers = BATCH * SEQ, LLAMA["dim"], LLAMA["n_layer"]
    events = traced.trace.events  # DTensor's gathers are functional collectives; FSDP2's are not
    gathers = [c for c in traced.collectives if c.kind == "all_gather" and events[c.index].name.startswith("_c10d")]
    assert sorted(c.bytes for c in gathers) == sorted([tokens * dim] * 4 * layers + [tokens * dim * 2] * 2)


def test_the_cast_is_timed_on_the_shard():
    """The q projection's forward cast on H100: reading the 16-bit rows twice (the amax, the
    cast) and writing FP8 twice (row- and column-wise), over the rank's 1 / TP of them."""
    execution = Execution(world=2 * TP, data="zero1", tensor=TP, sequence_parallel=True, micro_batch=BATCH)
    traced = _trace(execution)
    gpu = load_gpu("h100")
    profile = default_profile(gpu)
    trace = traced.trace
    counts = {c.index: c for c in count_ops(trace)}
    wq = next(i for i, s in trace.config["fp8_cast_shares"].items()
              if trace.events[i].module.endswith("wq") and str(trace.events[i].phase) == "forward")
    shared = KernelModel(gpu, profile, train=True, fp8_linears=frozenset(trace.config["fp8_linears"]),
                         fp8_cast_shares=trace.config["fp8_cast_shares"]).time_op(counts[wq], 0.0)
    whole = KernelModel(gpu, profile, train=True, fp8_linears=frozenset(trace.config["fp8_linears"])).time_op(counts[wq], 0.0)
    rows, dim = BATCH * SEQ, LLAMA["dim"]  # the gathered input, (tokens, dim)
    whole_bytes, shard_bytes = rows * dim * (2 * 2 + 2), rows * dim * (2 * 2 + 2) / TP
    gemm_bytes = whole.memory_s * gpu.memory_bandwidth - whole_bytes
    assert shared.memory_s * gpu.memory_bandwidth == pytest.approx(gemm_bytes + shard_bytes)


def test_a_gather_an_fp8_gemm_reads_moves_one_byte_an_element():
    """Transformer Engine gathers the FP8 tensor: in each block the attention's and the MLP's
    gathered norm outputs (forward, and again in backward for their weight gradients) and the
    output gradients of their row-parallel layers (backward), (tokens, dim) at one byte. Two
    gathers no FP8 GEMM reads keep two bytes: the final norm's output for the 16-bit head
    (forward) and the gradient of the embedding's output (backward's last)."""
    execution = Execution(world=2 * TP, data="zero1", tensor=TP, sequence_parallel=True, micro_batch=BATCH)
    traced = _trace(execution)
    tp_group = traced.trace.config["tensor_parallel_group"]
    gathers = [c for c in traced.collectives if c.kind == "all_gather" and c.group == tp_group]
    tokens, dim, layers = BATCH * SEQ, LLAMA["dim"], LLAMA["n_layer"]
    head = next(c for c in gathers if c.module.endswith(".output"))
    embedding = gathers[-1]
    assert head.bytes == embedding.bytes == tokens * dim * 2
    blocks = [c for c in gathers if c not in (head, embedding)]
    assert len(blocks) == 2 * 3 * layers  # 2 sublayers x (forward input, its re-gather, output grad)
    assert {c.bytes for c in blocks} == {tokens * dim}


def test_a_linear_with_bias_casts_its_input_not_its_bias():
    """GPT-2's linears trace as addmm(bias, input, weight): the gathered input is the operand."""
    from nnperf.zoo import get_model

    gpt2 = {"n_layer": 2, "n_embd": 32, "n_head": 4, "vocab": 101, "n_positions": SEQ}
    execution = Execution(world=2 * TP, data="zero1", tensor=TP, sequence_parallel=True, micro_batch=BATCH)
    traced = trace_rank(lambda: get_model("gpt2").build(batch=BATCH, seq_len=SEQ, **gpt2),
                        TraceOptions(optimizer="adamw", dtype="bf16", fp8=True), execution, lambda model: [])
    shares = _shares(traced)
    assert shares[("forward", "c_attn")] == shares[("forward", "c_fc")] == [1 / TP] * gpt2["n_layer"]


def test_a_recomputed_forward_casts_a_modules_input_once_too():
    """Under full checkpointing each block's forward runs again in backward, up to its last op
    backward needs (w2's output is not: torch's checkpoint stops before it). The recomputed
    wq and w1 cast the gathered input's shard again (1 / TP), wk, wv and w3 reuse it, as the
    forward's did; wo casts its own input whole (no share). Counted over the recomputed GEMMs,
    whose module the trace names by the backward that recomputes them."""
    from nnperf.search.plan import prepare_for
    from nnperf.zoo import get_model

    execution = Execution(world=2 * TP, data="fsdp", shard=2, tensor=TP, sequence_parallel=True, micro_batch=BATCH,
                          checkpoint="full")
    traced = trace_rank(lambda: get_model("llama-7b").build(batch=BATCH, seq_len=SEQ, **LLAMA),
                        TraceOptions(optimizer="adamw", dtype="bf16", fp8=True), execution,
                        lambda model: [f"layers.{i}" for i in range(LLAMA["n_layer"])], prepare_for(execution))
    shares = traced.trace.config["fp8_cast_shares"]
    recomputed = [e.index for e in traced.trace.events if e.recomputed and e.name == "aten.mm"]
    layers = LLAMA["n_layer"]
    assert len(recomputed) == 6 * layers  # wq, wk, wv, wo, w1, w3
    assert sorted(shares[i] for i in recomputed if i in shares) == [0.0] * 3 * layers + [1 / TP] * 2 * layers


def test_the_experts_gate_and_up_projections_cast_their_input_once():
    """Megatron-Core's experts are TE's GroupedLinear in FP8 too, gate and up one layer
    (``linear_fc1``): of the traced pair of grouped GEMMs over the routed tokens the second
    reuses the first's cast; the down projection's input and every backward operand are cast."""
    from nnperf.zoo import get_model

    moe = {**LLAMA, "n_experts": 4, "top_k": 2, "moe_hidden": 16}
    traced = trace_rank(lambda: get_model("llama-7b").build(batch=BATCH, seq_len=SEQ, **moe),
                        TraceOptions(optimizer="adamw", dtype="bf16", fp8=True),
                        Execution(world=2, data="zero1", micro_batch=BATCH), lambda model: [])
    trace = traced.trace
    assert trace.config["fp8_experts"]
    grouped = [e for e in trace.events if e.name == "aten._grouped_mm"]
    forward = [e.index for e in grouped if str(e.phase) == "forward"]
    assert len(forward) == 3 * LLAMA["n_layer"]  # gate, up, down in each block
    shares = trace.config["fp8_cast_shares"]
    assert [shares.get(i) for i in forward] == [None, 0.0, None] * LLAMA["n_layer"]
    assert all(e.index not in shares for e in grouped if str(e.phase) == "backward")
