"""Megatron-Core's tensor parallelism of a mixture-of-experts layer (``trace.parallel.expert_tensor``):
run for real on 2 gloo ranks (each the sequence shard of one tensor-parallel rank) against the
same layer run whole on one process, its collectives against a traced rank's, and a traced
Megatron-LM layout (ZeRO-1 x TP 2 x EP 2) counted by hand.

The real run's tokens are built so that the router picks exactly the experts the trace assumes
(``trace.routing.assigned_experts``), and both sequence shards alike: every rank then receives
as many rows per expert as the trace assumes, which its all-gather of rows needs."""

from __future__ import annotations

import pytest
import torch
from gloo_ranks import SeenCollectives, run_ranks
from moe_cases import assumed_tokens, steered_moe

from nnperf.errors import UsageError
from nnperf.layout import Execution
from nnperf.report.engine_configs import megatron_args
from nnperf.search.plan import prepare_for
from nnperf.trace.distributed import trace_rank
from nnperf.trace.options import TraceOptions
from nnperf.zoo.llama import build
from nnperf.zoo.moe import MoE

pytestmark = pytest.mark.process

TP = 2
DIM, HIDDEN, EXPERTS, TOP_K, SHARD_TOKENS, SHARED = 16, 32, 8, 2, 6, 24


def _model() -> MoE:
    """With shared experts (DeepSeek's), split as a dense SwiGLU is."""
    return steered_moe(DIM, HIDDEN, EXPERTS, TOP_K, SHARED)


def _tokens() -> torch.Tensor:
    """Two sequence shards of the same tokens, each routed as the trace assumes."""
    shard = assumed_tokens(SHARD_TOKENS, DIM, EXPERTS, TOP_K)
    return torch.cat([shard, shard * 1.5], dim=1)  # the same experts, other values


def _worker(rank: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    from nnperf.trace.parallel.expert import apply_experts
    from nnperf.trace.parallel.expert_tensor import split_moe

    mesh = init_device_mesh("cpu", (TP,), mesh_dim_names=("tensor",))
    model, whole = _model(), _model()
    split_moe(model, mesh, sequence_parallel=True)
    apply_experts(model, 1, None)
    x = _tokens().requires_grad_()
    mine = x.detach().chunk(TP, dim=1)[rank].requires_grad_()
    seen = SeenCollectives(functional=True)
    with seen:
        out = model(DTensor.from_local(mine, mesh, [Shard(1)], run_check=False))
        output = out.detach().clone()
        out.sum().backward()
    reference = whole(x)
    reference.sum().backward()
    expected_input_grad = x.grad.chunk(TP, dim=1)[rank]
    width = HIDDEN // TP
    slices = {"w1": (1, rank * width), "w3": (1, rank * width), "w2": (2, rank * width)}
    gate_placement = str(model.gate.weight.grad.placements[0])
    grad_error = {"input": float((mine.grad - expected_input_grad).abs().max() / expected_input_grad.abs().max()),
                  "gate": float((model.gate.weight.grad.full_tensor() - whole.gate.weight.grad).abs().max()
                                / whole.gate.weight.grad.abs().max())}
    for name, (dim, start) in slices.items():
        expected = getattr(whole.experts, name).grad.narrow(dim, start, width)
        got = getattr(model.experts, name).grad.to_local()
        grad_error[name] = float((got - expected).abs().max() / expected.abs().max())
    for name in ("w1", "w2", "w3"):
        expected = getattr(whole.shared_expert, name).weight.grad
        got = getattr(model.shared_expert, name).weight.grad.full_tensor()
        grad_error[f"shared {name}"] = float((got - expected).abs().max() / expected.abs().max())
    expected_out = reference.detach().chunk(TP, dim=1)[rank]
    return {"output_error": float((output - expected_out).abs().max() / expected_out.abs().max()),
            "grad_error": grad_error, "collectives": seen.seen, "gate_placement": gate_placement,
            "expert_shape": tuple(model.experts.w1.to_local().shape),
            "shared_shapes": [tuple(getattr(model.shared_expert, n).weight.to_local().shape) for n in ("w1", "w3", "w2")]}


@pytest.fixture(scope="module")
def real_runs():
    return run_ranks(_worker, TP, timeout_s=240)


def test_split_layer_computes_what_the_whole_layer_does(real_runs):
    for result in real_runs.values():
        # the experts' GEMMs run in bf16: the two halves' partial outputs are each rounded to
        # bf16 before their sum, as Megatron-Core's are before its reduce-scatter (bf16's
        # relative step is 2^-8); the experts' own gradients are exact
        assert result["output_error"] < 2 ** -7
        assert result["grad_error"]["gate"] < 2 ** -7
        assert result["grad_error"]["input"] < 2 ** -7
        assert max(result["grad_error"][w] for w in ("w1", "w2", "w3")) < 1e-6, result["grad_error"]
        assert max(result["grad_error"][f"shared {w}"] for w in ("w1", "w2", "w3")) < 1e-5, result["grad_error"]
        assert result["expert_shape"] == (EXPERTS, HIDDEN // TP, DIM)
        assert result["shared_shapes"] == [(SHARED // TP, DIM), (SHARED // TP, DIM), (DIM, SHARED // TP)]


def test_collectives_by_hand(real_runs):
    """Forward: the routed rows all-gathered from both ranks, their partial outputs
    reduce-scattered back (tokens x k rows of DIM fp32 per rank), then the shared experts'
    input gathered (both shards' tokens) and their output reduce-scattered; backward: the
    reverse of each, the shared experts' first (they ran last). The router saw only this rank's
    tokens: its gradient is a partial sum, reduced over the tensor-parallel ranks where the
    other sequence-parallel weights' are (a traced layout's step, below)."""
    rows = SHARD_TOKENS * TOP_K * DIM * 4
    tokens = TP * SHARD_TOKENS * DIM * 4
    routed, shared = [("all_gather", 2 * rows), ("reduce_scatter", 2 * rows)], [("all_gather", tokens),
                                                                                ("reduce_scatter", tokens)]
    assert real_runs[0]["collectives"] == routed + shared + shared + routed
    assert real_runs[0]["gate_placement"] == "P(sum)"  # Partial(sum)


TINY = {"n_layer": 2, "dim": 64, "n_heads": 4, "n_kv_heads": 4, "ffn_hidden": 128, "vocab": 128,
        "n_experts": 4, "top_k": 2, "moe_hidden": 96}
SEQ = 32


def _traced(execution: Execution):
    return trace_rank(lambda: build(1, SEQ, **TINY), TraceOptions(optimizer="adamw", dtype="bf16"), execution,
                      lambda model: ["layers.0", "layers.1"], prepare=prepare_for(execution))


def test_megatron_layout_by_hand():
    """ZeRO-1 over 4 ranks as 2 expert-parallel x 2 tensor-parallel: per MoE layer and pass, the
    rows (16 tokens of this sequence shard x 2 experts each, 64 bf16 features) go to their
    experts' rank over the expert group (ranks 0 and 2), are gathered from both tensor-parallel
    ranks (0 and 1) and come back the same way; each rank holds 2 of the 4 experts, 48 of
    their 96 hidden features."""
    execution = Execution(world=4, data="zero1", tensor=2, sequence_parallel=True, expert=2)
    traced = _traced(execution)
    rows = SEQ // 2 * 2 * 64 * 2
    forward = [(c.kind, c.bytes, c.group_ranks) for c in traced.collectives
               if c.phase == "forward" and c.kind in ("all_to_all", "all_gather", "reduce_scatter")
               and c.bytes in (rows, 2 * rows)]
    per_layer = [("all_to_all", rows, (0, 2)), ("all_gather", 2 * rows, (0, 1)),
                 ("reduce_scatter", 2 * rows, (0, 1)), ("all_to_all", rows, (0, 2))]
    moe_forward = [c for c in forward if c[2] == (0, 2) or c[1] == 2 * rows]
    assert moe_forward == per_layer * 2
    experts = [_local(p) for name, p in traced.workload.model.named_parameters() if ".experts." in name]
    assert {tuple(p.shape) for p in experts} == {(2, 48, 64), (2, 64, 48)}
    assert sum(p.numel() * p.element_size() for p in experts) == 2 * 3 * 2 * 48 * 64 * 2  # 2 layers, bf16


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def test_refusals():
    with pytest.raises(UsageError, match="ddp or zero1"):
        Execution(world=4, data="fsdp", shard=2, tensor=2, sequence_parallel=True, expert=2).validate()
    with pytest.raises(UsageError, match="needs sequence parallelism"):
        _traced(Execution(world=4, data="zero1", tensor=2, sequence_parallel=False))
    with pytest.raises(UsageError, match="torchtitan's"):
        _traced(Execution(world=4, data="fsdp", shard=2, tensor=2, sequence_parallel=True))
    # nnperf measure --layout: refused before any process group or mesh is touched
    import contextlib

    from nnperf.trace.parallel import apply_layout

    with pytest.raises(UsageError, match="planned, not run on GPUs"):
        apply_layout(build(1, SEQ, **TINY), Execution(world=4, data="zero1", tensor=2, sequence_parallel=True),
                     TraceOptions(), (None,) * 5, lambda model: [], None, contextlib.ExitStack(), real=True)


def test_folded_expert_group_by_hand():
    """ZeRO-1 over 4 ranks as TP 2 x 2 data-parallel ranks with EP 4: 4 does not divide the 2
    data-parallel ranks, so the expert group folds over the tensor-parallel ones (Megatron-Core's
    MoE parallel folding, expert tensor parallelism 1): one whole expert (96 hidden) per rank, the
    rows of this rank's sequence shard (16 tokens x 2 experts of 64 bf16 features) sent over all
    4 ranks by the all-to-all alone, no all-gather or reduce-scatter of rows."""
    execution = Execution(world=4, data="zero1", tensor=2, sequence_parallel=True, expert=4)
    assert execution.folds_experts
    traced = _traced(execution)
    rows = SEQ // 2 * 2 * 64 * 2
    moe = [(c.phase, c.kind, c.bytes) for c in traced.collectives if c.group_ranks == (0, 1, 2, 3)
           and c.kind == "all_to_all" and c.bytes == rows]
    assert moe == [("forward", "all_to_all", rows)] * 4 + [("backward", "all_to_all", rows)] * 4
    assert not [c for c in traced.collectives if c.kind in ("all_gather", "reduce_scatter") and c.bytes == 2 * rows]
    experts = [_local(p) for name, p in traced.workload.model.named_parameters() if ".experts." in name]
    assert {tuple(p.shape) for p in experts} == {(1, 96, 64), (1, 64, 96)}
    assert "--expert-tensor-parallel-size 1" in megatron_args(execution, 2, amp=None, dtype="bf16")


def test_experts_whole_where_the_data_parallel_ranks_hold_the_expert_group():
    """ZeRO-1 over 8 ranks as TP 2 x 4 data-parallel ranks with EP 2, which divides them: by
    default each expert is split over the tensor ranks (Megatron-Core's default); with expert
    tensor parallelism 1 (DeepSeek-V3's and Qwen3's recipes) the expert group is the 2
    tensor-parallel ranks: 2 of the 4 experts whole a rank (96 hidden), the rows of this rank's
    sequence shard (16 tokens x 2 experts of 64 bf16 features) sent between ranks 0 and 1 by
    the all-to-all alone, the experts' gradients reduced over the 4 data-parallel ranks."""
    assert not Execution(world=8, data="zero1", tensor=2, sequence_parallel=True, expert=2).folds_experts
    execution = Execution(world=8, data="zero1", tensor=2, sequence_parallel=True, expert=2, expert_tensor=1)
    assert execution.folds_experts
    traced = _traced(execution)
    rows = SEQ // 2 * 2 * 64 * 2
    moe = [(c.phase, c.kind) for c in traced.collectives if c.group_ranks == (0, 1) and c.kind == "all_to_all"
           and c.bytes == rows]
    assert moe == [("forward", "all_to_all")] * 4 + [("backward", "all_to_all")] * 4
    assert not [c for c in traced.collectives if c.kind in ("all_gather", "reduce_scatter") and c.bytes == 2 * rows]
    experts = [_local(p) for name, p in traced.workload.model.named_parameters() if ".experts." in name]
    assert {tuple(p.shape) for p in experts} == {(2, 96, 64), (2, 64, 96)}
    assert any(c.phase == "backward" and c.kind == "reduce_scatter" and c.group_ranks == (0, 2, 4, 6)
               for c in traced.collectives)
    assert "--expert-tensor-parallel-size 1" in megatron_args(execution, 2, amp=None, dtype="bf16")


def test_expert_tensor_parallelism_outside_what_is_modelled_is_refused():
    for fields, message in (({"expert": 2, "expert_tensor": 4}, "valid: 1, 2"),
                            ({"expert": 1, "expert_tensor": 1}, "needs expert parallelism"),
                            ({"expert": 3, "expert_tensor": 1}, "valid: 2, 4, 8")):
        with pytest.raises(UsageError, match=message):
            Execution(world=8, data="zero1", tensor=2, sequence_parallel=True, **fields).validate()
