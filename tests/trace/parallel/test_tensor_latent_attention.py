"""Tensor parallelism of multi-head latent attention as Megatron-Core splits it
(``zoo.mla.tensor_parallel_styles``) and of DeepSeek's shared experts
(``trace.parallel.expert_tensor.split_shared_expert``): run for real on 2 gloo ranks against the
same module run whole on one process, its collectives counted by hand, and a traced Megatron-LM
layout of DeepSeek's architecture (ZeRO-1 x TP 2 + SP x EP 2)."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from gloo_ranks import SeenCollectives, run_ranks

from nnperf.layout import Execution
from nnperf.search.plan import prepare_for
from nnperf.trace.distributed import trace_rank
from nnperf.trace.options import TraceOptions
from nnperf.zoo.deepseek import build
from nnperf.zoo.mla import MultiHeadLatentAttention

pytestmark = pytest.mark.process

TP = 2
DIM, HEADS, Q_LORA, KV_LORA, NOPE, ROPE, V, TOKENS = 64, 4, 24, 32, 16, 8, 12, 10


def _attention() -> MultiHeadLatentAttention:
    torch.manual_seed(0)
    m = MultiHeadLatentAttention(DIM, HEADS, Q_LORA, KV_LORA, NOPE, ROPE, V)
    for p in m.parameters():  # norms away from their all-ones start, so the test sees them
        torch.nn.init.normal_(p, std=0.3)
    return m


def _worker(rank: int, sequence_parallel: bool) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    from nnperf.trace.parallel.tensor import replicate_rest
    from nnperf.zoo.mla import tensor_parallel_styles

    mesh = init_device_mesh("cpu", (TP,), mesh_dim_names=("tensor",))
    whole = _attention()
    model = copy.deepcopy(whole)
    parallelize_module(model, mesh, tensor_parallel_styles(model, sequence_parallel))
    replicate_rest(model, mesh)
    x = torch.randn(1, TOKENS, DIM, generator=torch.Generator().manual_seed(1))
    mine = x.chunk(TP, dim=1)[rank] if sequence_parallel else x
    seen = SeenCollectives(functional=True)
    with seen:
        out = model(mine)
        output = out.detach().clone()
        out.sum().backward()
    reference = whole(x)
    reference.sum().backward()
    expected_out = reference.detach().chunk(TP, dim=1)[rank] if sequence_parallel else reference.detach()
    grad_error = {}
    for name, param in model.named_parameters():
        expected = dict(whole.named_parameters())[name].grad
        got = param.grad.full_tensor()
        grad_error[name] = float((got - expected).abs().max() / expected.abs().max())
    return {"output_error": float((output - expected_out).abs().max() / expected_out.abs().max()),
            "grad_error": grad_error, "collectives": seen.seen,
            "placements": {name: str(p.placements[0]) for name, p in model.named_parameters()}}


@pytest.fixture(scope="module")
def sequence_parallel_runs():
    return run_ranks(functools.partial(_worker, sequence_parallel=True), TP, timeout_s=240)


@pytest.fixture(scope="module")
def replicated_runs():
    return run_ranks(functools.partial(_worker, sequence_parallel=False), TP, timeout_s=240)


@pytest.mark.parametrize("runs", ["sequence_parallel_runs", "replicated_runs"])
def test_split_attention_computes_what_the_whole_one_does(runs, request):
    for result in request.getfixturevalue(runs).values():
        assert result["output_error"] < 1e-5
        assert max(result["grad_error"].values()) < 1e-5, result["grad_error"]


def test_placements_are_megatron_cores(sequence_parallel_runs):
    """Down-projections and norms whole on every rank (``parallel_mode="duplicated"``), the
    up-projections split by heads (output rows), the output projection by its input columns."""
    placements = sequence_parallel_runs[0]["placements"]
    assert placements == {"wq_a.weight": "R", "q_norm.weight": "R", "wkv_a.weight": "R", "kv_norm.weight": "R",
                          "wq_b.weight": "S(0)", "wkv_b.weight": "S(0)", "wo.weight": "S(1)"}


def test_sequence_parallel_collectives_by_hand(sequence_parallel_runs):
    """Forward: the query latent, the shared rotary key and the key/value latent gathered over
    the sequence (TOKENS rows each, fp32), then the output reduce-scattered back to the shards;
    backward: the hidden state's gradient gathered for the output projection, and each gather's
    reverse, a reduce-scatter of its rows' gradients. Never the hidden state gathered in
    forward, as torchtitan's plan does."""
    gathered = {"q latent": TOKENS * Q_LORA * 4, "rotary key": TOKENS * ROPE * 4, "kv latent": TOKENS * KV_LORA * 4}
    hidden = TOKENS * DIM * 4
    forward = [("all_gather", b) for b in gathered.values()] + [("reduce_scatter", hidden)]
    backward = [("all_gather", hidden)] + [("reduce_scatter", b) for b in gathered.values()]
    for result in sequence_parallel_runs.values():
        seen = result["collectives"]
        assert seen[:4] == forward
        assert sorted(seen[4:]) == sorted(backward)


TINY = {"n_layer": 3, "n_dense_layers": 1, "dim": 64, "n_heads": 4, "q_lora": 0, "kv_lora": 32, "qk_nope_dim": 16,
        "qk_rope_dim": 8, "v_head_dim": 16, "ffn_hidden": 128, "n_experts": 4, "top_k": 2, "moe_hidden": 32,
        "n_shared_experts": 2, "vocab": 128}
SEQ = 32


def test_megatron_layout_of_deepseek_by_hand():
    """ZeRO-1 over 4 ranks as 2 expert-parallel x 2 tensor-parallel ranks with sequence
    parallelism. Per block, forward, over the tensor-parallel pair (ranks 0 and 1): the queries'
    input (no query latent: ``q_lora`` 0, so ``wq`` gathers the hidden state, SEQ x 64 bf16),
    the rotary key (SEQ x 8) and the key/value latent (SEQ x 32) gathered; in each MoE block the
    shared experts' input gathered too (SEQ x 64). Each rank holds half of every head-split
    weight and of the shared experts' SwiGLU (2 x 32 = 64 wide)."""
    execution = Execution(world=4, data="zero1", tensor=2, sequence_parallel=True, expert=2)
    traced = trace_rank(lambda: build(1, SEQ, **TINY), TraceOptions(optimizer="adamw", dtype="bf16"), execution,
                        lambda model: ["layers.0", "layers.1", "layers.2"], prepare=prepare_for(execution))
    gathers = [c.bytes for c in traced.collectives
               if c.phase == "forward" and c.kind == "all_gather" and c.group_ranks == (0, 1)]
    hidden, rope, latent = SEQ * 64 * 2, SEQ * 8 * 2, SEQ * 32 * 2
    attention = [hidden, rope, latent]
    # block 0 dense (its SwiGLU's input gathered), blocks 1 and 2 MoE (the shared experts' input
    # gathered; the routed rows' gathers are bf16 rows of top_k x SEQ/2 tokens: 2 x 16 x 64 x 2)
    routed = 2 * (SEQ // 2) * 64 * 2 * 2
    # and the final norm's output gathered for the vocabulary-split output projection
    assert [b for b in gathers if b != routed] == [*attention, hidden] * 3 + [hidden]
    shapes = {name.removeprefix("module."): tuple(_local(p).shape)
              for name, p in traced.workload.model.named_parameters()
              if ".layers.1." in f".{name}" and ("attention." in name or "shared" in name)}
    assert shapes == {
        "layers.1.attention.wq.weight": (4 * (16 + 8) // 2, 64),
        "layers.1.attention.wkv_a.weight": (32 + 8, 64),
        "layers.1.attention.kv_norm.weight": (32,),
        "layers.1.attention.wkv_b.weight": (4 * (16 + 16) // 2, 32),
        "layers.1.attention.wo.weight": (64, 4 * 16 // 2),
        "layers.1.moe.shared_expert.w1.weight": (32, 64),
        "layers.1.moe.shared_expert.w3.weight": (32, 64),
        "layers.1.moe.shared_expert.w2.weight": (64, 32),
    }



def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t
