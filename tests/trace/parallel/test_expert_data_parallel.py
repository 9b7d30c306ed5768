"""Expert parallelism with DDP and ZeRO-1, as Megatron-LM runs it (``--expert-model-parallel-size``
with its DDP or distributed optimizer): the expert group carved out of the data-parallel ranks,
the experts' gradients in buckets of their own reduced over the ranks outside it (its
expert-data-parallel group), every gradient divided by the whole data-parallel size.

One MoE layer on 4 gloo ranks, experts split over 2: each rank's step traced on a fake process
group against the same step run for real (every collective's kind and bytes, in order; the
parameter, gradient and optimizer-state bytes), the real run's gradients and its two AdamW
steps against the whole layer on one process, and the collectives and bytes worked out by hand.
The real run's tokens are the ones the trace assumes routed (``test_expert._tokens``)."""

from __future__ import annotations

import contextlib

import pytest
import torch
from gloo_ranks import SeenCollectives, run_ranks
from test_expert import DIM, EXPERTS, HIDDEN, TOKENS, TOP_K, _model, _tokens

from nnperf.errors import UsageError
from nnperf.layout import Execution
from nnperf.trace.distributed import sharded_bytes, trace_rank
from nnperf.trace.options import TraceOptions
from nnperf.workload import Workload

pytestmark = pytest.mark.process

WORLD, EP = 4, 2
BUCKET = 4000  # bytes: each expert weight (4 local experts of 24 x 16 fp32: 6144 bytes) a bucket of its own
OPTIONS = TraceOptions(optimizer="adamw")
ENGINES = ("ddp", "zero1")
MAX_NORM = 1e-3  # below the gradients' norm: the first step's update is clipped


def _execution(data: str) -> Execution:
    return Execution(world=WORLD, data=data, expert=EP, bucket_bytes=BUCKET)


def _storage_bytes(tensors) -> int:
    return sum({id(t.untyped_storage()): t.untyped_storage().nbytes() for t in tensors}.values())


def _worker(rank: int) -> dict:
    from nnperf.trace.parallel import apply_layout, build_meshes
    from nnperf.trace.step import make_optimizer

    results = {}
    for data in ENGINES:
        execution = _execution(data)
        meshes = build_meshes(execution)
        model, whole, x = _model(), _model(), _tokens()
        workload = Workload(model=model, inputs=(x,), loss_fn=lambda out: out.sum())
        # DDP as a measured run builds it; ZeRO-1 with experts as the trace does (a real run refuses it:
        # DDP's bucket rebuild after the first step does not know the experts' group)
        apply_layout(workload, execution, OPTIONS, meshes, lambda m: [], None, contextlib.ExitStack(),
                     real=data == "ddp")
        optimizer, reference = make_optimizer(workload.model, OPTIONS), make_optimizer(whole, OPTIONS)
        workload.model(x).sum().backward()
        whole(x).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        wanted = {n: p.grad.clone() for n, p in whole.named_parameters()}
        norms = []
        for step in range(3):  # the third step is the steady state (DDP rebuilds its buckets after the first)
            if step:
                seen = SeenCollectives()
                with seen:
                    workload.model(x).sum().backward()
                    optimizer.step()
                whole(x).sum().backward()
            else:
                norms.append(_clip(workload.model, optimizer))
                norms.append(float(torch.nn.utils.clip_grad_norm_(list(whole.parameters()), MAX_NORM)))
                optimizer.step()
            reference.step()
            if step < 2:
                optimizer.zero_grad()
                reference.zero_grad()
        params = list(model.parameters())
        state = {"parameters": _storage_bytes(params), "gradients": _storage_bytes(p.grad for p in params),
                 "optimizer_state": _storage_bytes(v for s in optimizer.state.values() for v in s.values())}
        if hasattr(optimizer, "finish"):
            optimizer.finish()
        updated = {n: p.detach().clone() for n, p in model.named_parameters()}
        results[data] = {"norms": norms, "collectives": seen.seen, "bytes": state, "grads": grads, "wanted": wanted,
                         "updated": updated, "reference": {n: p.detach().clone() for n, p in whole.named_parameters()}}
    return results


def _clip(model, optimizer) -> float:
    """The first step's clipping as the traced step runs it (``trace.step``), on what the optimizer
    updates (ZeRO-1: this rank's shares)."""
    from nnperf.trace.clip import APART_NORM, NORM_GROUPS, clip_grad_norm

    params = [p for group in optimizer.param_groups for p in group["params"]]
    return float(clip_grad_norm(params, MAX_NORM, None, tuple(getattr(model, NORM_GROUPS, ())),
                                getattr(model, APART_NORM, None)))


@pytest.fixture(scope="module")
def real_runs():
    return run_ranks(_worker, WORLD, timeout_s=300)


def _local(name: str, whole: torch.Tensor, rank: int) -> torch.Tensor:
    """The whole layer's tensor cut to what ``rank`` holds: its expert group's share of the
    experts (ranks 2i and 2i + 1 are one expert group: the expert dimension is innermost)."""
    if not name.startswith("experts."):
        return whole
    local = EXPERTS // EP
    return whole[(rank % EP) * local:(rank % EP + 1) * local]


def _traced(data: str, rank: int):
    def build() -> Workload:
        return Workload(model=_model(), inputs=(torch.randn(1, TOKENS, DIM),), loss_fn=lambda out: out.sum())

    return trace_rank(build, OPTIONS, _execution(data), lambda model: [], rank=rank)


@pytest.mark.slow
@pytest.mark.parametrize("data", ENGINES)
@pytest.mark.parametrize("rank", [0, 3])
def test_fake_process_group_reproduces_gloo(real_runs, data, rank):
    traced = _traced(data, rank)
    real = real_runs[rank][data]
    assert [(c.kind, c.bytes) for c in traced.collectives] == real["collectives"]
    assert sharded_bytes(traced) == real["bytes"]


@pytest.mark.slow
def test_ddp_gradients_are_the_whole_layers(real_runs):
    """Every rank fed the same tokens: the gate's gradient averaged over 4 ranks, each local
    expert's (its tokens from both ranks of its expert group) divided by 4 and summed over the
    2 ranks outside it, both equal the whole layer's."""
    for rank, result in real_runs.items():
        run = result["ddp"]
        for name, grad in run["grads"].items():
            want = _local(name, run["wanted"][name], rank)
            assert torch.allclose(grad, want, rtol=1e-5, atol=1e-6), (rank, name)


@pytest.mark.slow
@pytest.mark.parametrize("data", ENGINES)
def test_the_clipped_norm_is_the_whole_layers(real_runs, data):
    """Every rank's gradient norm is the whole layer's: DDP's dense gradients whole on each rank
    with each rank's own experts summed over the expert group; ZeRO-1's shares summed over the
    data-parallel group."""
    for rank, result in real_runs.items():
        ours, whole = result[data]["norms"]
        assert ours == pytest.approx(whole, rel=1e-5), (rank, data)


@pytest.mark.slow
@pytest.mark.parametrize("data", ENGINES)
def test_three_steps_update_as_adamw_on_the_whole_layer(real_runs, data):
    for rank, result in real_runs.items():
        run = result[data]
        for name, param in run["updated"].items():
            want = _local(name, run["reference"][name], rank)
            assert torch.allclose(param, want, rtol=1e-5, atol=1e-6), (rank, data, name)


def test_collectives_and_bytes_by_hand():
    """Rank 0 holds 4 of the 8 experts (three 4 x 24 x 16 fp32 weights, 6144 bytes each, a
    bucket each at 4000-byte buckets) and the 8 x 16 gate (512 bytes). DDP: each expert
    bucket all-reduced over ranks (0, 2), outside its expert group (0, 1), the gate over all 4.
    ZeRO-1: reduce-scattered over the same groups, gathered as the next forward starts, and the
    AdamW state of its shares: half of each expert bucket and a quarter of the gate, 2 fp32
    moments each, and a 4-byte step per share."""
    expert_weight, gate = 4 * HIDDEN * DIM * 4, EXPERTS * DIM * 4
    rows = TOKENS * TOP_K * DIM * 4
    ddp = _traced("ddp", 0)
    reduced = [(c.kind, c.bytes, c.group_ranks) for c in ddp.collectives if c.kind != "all_to_all"]
    assert sorted(reduced) == sorted([("all_reduce", expert_weight, (0, 2))] * 3
                                     + [("all_reduce", gate, (0, 1, 2, 3))])
    assert {(c.bytes, c.group_ranks) for c in ddp.collectives if c.kind == "all_to_all"} == {
        (EXPERTS * 8, (0, 1)), (rows, (0, 1))}
    assert sharded_bytes(ddp) == {"parameters": 3 * expert_weight + gate, "gradients": 3 * expert_weight + gate,
                                  "optimizer_state": 2 * (3 * expert_weight + gate) + 4 * 4}
    zero1 = _traced("zero1", 0)
    scattered = [(c.bytes, c.group_ranks) for c in zero1.collectives if c.kind == "reduce_scatter"]
    gathered = [(c.bytes, c.group_ranks) for c in zero1.collectives if c.kind == "all_gather"]
    assert sorted(scattered) == sorted(gathered) == sorted([(expert_weight, (0, 2))] * 3 + [(gate, (0, 1, 2, 3))])
    assert sharded_bytes(zero1)["optimizer_state"] == 2 * (3 * expert_weight // 2 + gate // 4) + 4 * 4


def test_expert_parallelism_divides_the_data_parallel_ranks():
    with pytest.raises(UsageError, match="data-parallel ranks of 4 ranks; valid: 1, 2, 4"):
        Execution(world=8, data="ddp", pipeline=2, pipeline_schedule="1f1b", grad_accum=2, expert=3).validate()
    Execution(world=8, data="zero1", tensor=2, sequence_parallel=True, expert=2).validate()  # expert TP
    with pytest.raises(UsageError, match="context parallelism it is not"):
        Execution(world=8, data="zero1", context=2, expert=2).validate()
    Execution(world=8, data="zero1", pipeline=2, pipeline_schedule="1f1b", grad_accum=2, expert=4).validate()


def test_clipping_sums_the_norm_once_over_the_right_ranks():
    """--clip-grad-norm: DDP all-reduces the experts' squared norm (4 bytes) over the expert group
    (0, 1), the dense gradients being whole on every rank; ZeRO-1 the sum of its shares' over the
    data-parallel ranks, once."""
    def build() -> Workload:
        return Workload(model=_model(), inputs=(torch.randn(1, TOKENS, DIM),), loss_fn=lambda out: out.sum())

    options = TraceOptions(optimizer="adamw", clip_grad_norm=1.0)
    for data, groups in (("ddp", [(0, 1)]), ("zero1", [(0, 1, 2, 3)])):
        traced = trace_rank(build, options, _execution(data), lambda model: [], rank=0)
        norms = [c.group_ranks for c in traced.collectives if c.kind == "all_reduce" and c.bytes == 4]
        assert norms == groups, data


def test_accumulation_reduces_the_experts_once_per_step():
    """With 2 micro-batches every gradient collective, the experts' too, is over a group the
    step's data-parallel reduction runs on (its groups: reduced once per step, not per micro-batch)."""
    def build() -> Workload:
        return Workload(model=_model(), inputs=(torch.randn(1, TOKENS, DIM),), loss_fn=lambda out: out.sum())

    for data in ENGINES:
        execution = Execution(world=WORLD, data=data, expert=EP, bucket_bytes=BUCKET, grad_accum=2)
        traced = trace_rank(build, OPTIONS, execution, lambda model: [], rank=0)
        reducing = {c.group for c in traced.collectives if c.kind in ("all_reduce", "reduce_scatter")}
        assert len(reducing) == 2  # the dense gradients' group and the experts' own
        assert reducing <= set(traced.trace.config["data_parallel_groups"]), data
