"""Expert parallelism (``trace.parallel.expert``): one rank's step traced on a fake process group
against the same step run for real on 4 gloo ranks (FSDP2 over 4, experts split over 2), and the
real run's outputs and gradients against the same MoE layer run whole on one process.

The real run's tokens are built so that the router picks exactly the experts the trace assumes
(``trace.routing.assigned_experts``, uniform): each token's input is large on its assumed
experts' gate rows, so the all-to-all splits are the real ones, not a closed form."""

from __future__ import annotations

import pytest
import torch
from gloo_ranks import SeenCollectives, run_ranks
from moe_cases import assumed_tokens, steered_moe

from nnperf.errors import UsageError
from nnperf.layout import Execution
from nnperf.trace.distributed import sharded_bytes, trace_rank
from nnperf.trace.options import TraceOptions
from nnperf.workload import Workload
from nnperf.zoo.moe import MoE

pytestmark = pytest.mark.process

WORLD, EP = 4, 2
DIM, HIDDEN, EXPERTS, TOP_K, TOKENS = 16, 24, 8, 2, 12
EXECUTION = Execution(world=WORLD, data="fsdp", shard=WORLD, expert=EP)

def _model() -> MoE:
    return steered_moe(DIM, HIDDEN, EXPERTS, TOP_K)


def _tokens() -> torch.Tensor:
    return assumed_tokens(TOKENS, DIM, EXPERTS, TOP_K)


def _worker(rank: int) -> dict:
    from nnperf.trace.parallel import build_meshes
    from nnperf.trace.parallel.data import fully_shard_blocks
    from nnperf.trace.parallel.expert import apply_experts, shard_experts

    # gloo has no pre-multiplied sum, which the experts' divide factor uses, so on gloo they are
    # averaged over the 2 ranks they are reduced over instead of the 4 data-parallel ranks: their
    # gradients come out EP times the whole layer's (their tokens arrive from EP ranks)
    execution = EXECUTION
    _, dp_mesh, _, ep_mesh, experts_mesh = build_meshes(execution)
    model = _model()
    whole = _model()
    apply_experts(model, EP, ep_mesh)
    shard_experts(model, experts_mesh, execution, None)
    fully_shard_blocks(model, dp_mesh, [], execution.reshard_after_forward)
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    x = _tokens()
    out = model(x)  # the first step against the same tokens through the whole layer
    out.sum().backward()
    reference = whole(x)
    reference.sum().backward()
    full = {name: p.grad.full_tensor() / (EP if name.startswith("experts.") else 1)
            for name, p in model.named_parameters()}
    output_error = float((out - reference).abs().max() / reference.abs().max())
    grad_error = max(float((full[n] - p.grad).abs().max() / p.grad.abs().max()) for n, p in whole.named_parameters())
    optimizer.step()
    optimizer.zero_grad()
    seen = SeenCollectives()
    with seen:  # the second step: the steady state
        model(x).sum().backward()
        optimizer.step()
    return {"collectives": seen.seen, "bytes": _local_bytes(model, optimizer),
            "output_error": output_error, "grad_error": grad_error}


def _local_bytes(model, optimizer) -> dict[str, int]:
    def local(t):
        while hasattr(t, "_local_tensor"):
            t = t._local_tensor
        return t

    def total(ts):
        return sum({id(local(t).untyped_storage()): local(t).untyped_storage().nbytes() for t in ts}.values())

    return {"parameters": total(model.parameters()),
            "optimizer_state": total(v for s in optimizer.state.values() for v in s.values())}


@pytest.fixture(scope="module")
def real_runs():
    return run_ranks(_worker, WORLD, timeout_s=240)


def _traced(rank: int = 0):
    def build() -> Workload:
        return Workload(model=_model(), inputs=(torch.randn(1, TOKENS, DIM),), loss_fn=lambda out: out.sum())

    return trace_rank(build, TraceOptions(optimizer="adamw"), EXECUTION, lambda model: [], rank=rank)


def test_expert_parallel_layer_computes_what_the_whole_layer_does(real_runs):
    for result in real_runs.values():
        assert result["output_error"] < 1e-6  # the same bf16 expert GEMMs, rows regrouped
        assert result["grad_error"] < 1e-6


def test_fake_process_group_reproduces_gloo(real_runs):
    traced = _traced()
    assert [(c.kind, c.bytes) for c in traced.collectives] == real_runs[0]["collectives"]
    state = sharded_bytes(traced)
    assert state["parameters"] == real_runs[0]["bytes"]["parameters"]
    assert state["optimizer_state"] == real_runs[0]["bytes"]["optimizer_state"]


def test_collectives_by_hand():
    """Per step: the count all-to-all (8 experts x int64), the routed rows there and back
    (tokens x k rows of DIM fp32) in forward and both again in backward, over the expert
    group of 2 consecutive ranks; experts' weights gathered over the 2 ranks outside it."""
    traced = _traced()
    a2a = [c for c in traced.collectives if c.kind == "all_to_all"]
    rows = TOKENS * TOP_K * DIM * 4
    assert [(c.phase, c.bytes) for c in a2a] == [
        ("forward", EXPERTS * 8), ("forward", rows), ("forward", rows), ("backward", rows), ("backward", rows)]
    assert {c.group_ranks for c in a2a} == {(0, 1)}
    experts_bytes = 3 * EXPERTS * HIDDEN * DIM * 4
    gathers = [(c.bytes, c.group_ranks) for c in traced.collectives if c.kind == "all_gather" and c.phase == "forward"]
    assert (experts_bytes // EP, (0, 2)) in gathers  # this rank's 4 experts, from ranks 0 and 2
    params = sharded_bytes(traced)["parameters"]
    assert params == (experts_bytes + EXPERTS * DIM * 4) // WORLD


def test_layouts_expert_parallelism_refuses():
    with pytest.raises(UsageError, match="valid: 1, 2, 4"):
        Execution(world=4, data="fsdp", shard=4, expert=3).validate()
    with pytest.raises(UsageError, match="with ddp or zero1"):  # torchtitan's expert TP: not modelled
        Execution(world=8, data="fsdp", shard=4, tensor=2, expert=2).validate()
    with pytest.raises(UsageError, match="context parallelism it is not"):
        Execution(world=8, data="zero1", context=2, expert=2).validate()


def test_the_traced_rank_holds_the_busiest_expert_under_a_capacity_factor():
    """--moe-capacity-factor 2 over 8 experts: expert 0 gets 2/8 of the 24 routed rows (6), the
    other 7 share 18 (largest remainder: 3, 3, 3, 3, 2, 2, 2). Rank 0 holds experts 0-3 (15 of
    its own rows) and, every rank routing alike, receives 15 from each of the 2 ranks: 30 rows
    come back through the combine all-to-all, 24 leave through the dispatch. Each all-to-all is
    sized by the larger side, as rank 0 waits for it: 30 rows, there and back, both ways."""
    def build() -> Workload:
        return Workload(model=_model(), inputs=(torch.randn(1, TOKENS, DIM),), loss_fn=lambda out: out.sum())

    traced = trace_rank(build, TraceOptions(optimizer="adamw", moe_capacity_factor=2.0), EXECUTION, lambda m: [])
    row = DIM * 4
    a2a = [(c.phase, c.bytes) for c in traced.collectives if c.kind == "all_to_all"]
    assert a2a == [("forward", EXPERTS * 8), ("forward", 30 * row), ("forward", 30 * row),
                   ("backward", 30 * row), ("backward", 30 * row)]


@pytest.mark.parametrize("policy, recomputed, experts_gemms", [
    ("full", 3, 3), ("selective", 0, 0), ("selective-op", 0, 3), ("selective-op-recompute-a2a", 3, 3)])
def test_checkpointing_recomputes_what_its_policy_does_not_save(policy, recomputed, experts_gemms):
    """Per block's backward: the 2 all-to-alls of the gradients and the experts' 6 grouped GEMMs,
    plus, where the policy recomputes them, the forward's 3 all-to-alls (counts, dispatch,
    combine: full checkpointing) and 3 grouped GEMMs (full, and torchtitan's per-op policy,
    whose save list has the all-to-all but not ``_grouped_mm``; its earlier list had neither, so
    it recomputes the all-to-alls too); nnperf's selective policy saves both. The experts' FSDP gather inside the recomputed block is outside selective
    checkpointing's op cache, as in PyTorch from pytorch/pytorch#196862."""
    from nnperf.search.plan import prepare_for
    from nnperf.zoo import get_model

    spec = get_model("mixtral-8x7b")
    execution = Execution(world=WORLD, data="fsdp", shard=WORLD, expert=EP, checkpoint=policy)

    def build() -> Workload:
        return spec.build(1, 16, n_layer=2, dim=DIM, n_heads=4, n_kv_heads=2, ffn_hidden=HIDDEN, vocab=64)

    registered = torch._C._distributed_c10d._get_work_registry_size()
    traced = trace_rank(build, TraceOptions(optimizer="adamw"), execution, lambda m: ["layers.0", "layers.1"],
                        prepare_for(execution))
    # every collective the trace issued was waited: none left for "unwaited collective calls" at exit
    assert torch._C._distributed_c10d._get_work_registry_size() == registered
    backward = [c for c in traced.collectives if c.kind == "all_to_all" and c.phase == "backward"]
    assert len(backward) == 2 * (2 + recomputed)
    gemms = [e for e in traced.trace.events if e.name == "aten._grouped_mm" and e.phase == "backward"]
    assert len(gemms) == 2 * (6 + experts_gemms)


def test_received_rows_are_regrouped_expert_by_expert():
    """From source 0: 2 rows for expert 0, none for 1, 3 for 2; from source 1: 1, 4, 0. Expert
    0's rows are 0-1 then 5, expert 1's 6-9, expert 2's 2-4."""
    from nnperf.trace.parallel.expert import _expert_major

    assert _expert_major([[2, 0, 3], [1, 4, 0]], torch.device("cpu")).tolist() == [0, 1, 5, 6, 7, 8, 9, 2, 3, 4]
