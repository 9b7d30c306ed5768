"""ZeRO-1 (DDP with PyTorch's ``ZeroRedundancyOptimizer``) traced on a fake process group,
against the same step run for real by torch.distributed on CPU with gloo in 3 processes: each
rank's parameter, gradient and optimizer-state bytes (its own share of the optimizer state,
uneven by construction) and the kind and bytes of every collective, in order. The real run is
the engines' own; nothing here is copied from nnperf's output."""

from __future__ import annotations

import pytest
import torch
from gloo_ranks import SeenCollectives, run_ranks
from torch import nn

from nnperf.errors import UsageError
from nnperf.layout import Execution
from nnperf.trace.distributed import sharded_bytes, trace_rank
from nnperf.trace.options import TraceOptions
from nnperf.workload import Workload

WORLD = 3
BUCKET = 1000  # bytes: two DDP buckets of this model


def _model() -> nn.Sequential:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))


def _storage_bytes(tensors) -> int:
    return sum({id(t.untyped_storage()): t.untyped_storage().nbytes() for t in tensors}.values())


def _worker(rank: int) -> tuple[list[tuple[str, int]], dict[str, int]]:
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = _model()
    ddp = DistributedDataParallel(model, bucket_cap_mb=BUCKET / 2**20)
    optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3,
                                        foreach=True)
    for _ in range(3):  # the third step is the steady state (DDP rebuilds its buckets after the first)
        seen = SeenCollectives()
        with seen:
            ddp(torch.randn(4, 16)).sum().backward()
            optimizer.step()
        state = {"parameters": _storage_bytes(model.parameters()),
                 "gradients": _storage_bytes(p.grad for p in model.parameters()),
                 "optimizer_state": _storage_bytes(v for s in optimizer.optim.state.values() for v in s.values())}
        optimizer.zero_grad()
    return seen.seen, state


@pytest.fixture(scope="module")
def real_runs():
    return run_ranks(_worker, WORLD, timeout_s=120)


def _fake(rank: int, world: int = WORLD):
    def build() -> Workload:
        return Workload(model=_model(), inputs=(torch.randn(4, 16),), loss_fn=lambda out: out.sum())

    execution = Execution(world=world, data="zero1", bucket_bytes=BUCKET)
    return trace_rank(build, TraceOptions(optimizer="adamw"), execution, lambda model: ["0", "2"], rank=rank)


@pytest.mark.parametrize("rank", range(WORLD))
def test_fake_process_group_reproduces_gloo(real_runs, rank):
    real_collectives, real_bytes = real_runs[rank]
    traced = _fake(rank)
    assert [(c.kind, c.bytes) for c in traced.collectives] == real_collectives
    assert sharded_bytes(traced) == real_bytes


def test_each_rank_keeps_the_state_of_its_share_only():
    """ZeroRedundancyOptimizer hands the parameters out largest first, each to the rank holding
    the fewest elements so far: 512 -> rank 0, 256 -> rank 1, 32 and 8 -> rank 2. AdamW keeps
    two fp32 moments per element and a 4-byte step per tensor."""
    shares = {0: [512], 1: [256], 2: [32, 8]}
    for rank, numels in shares.items():
        assert sharded_bytes(_fake(rank))["optimizer_state"] == sum(8 * n + 4 for n in numels)


def test_the_optimizer_broadcasts_every_parameter_after_its_update():
    traced = _fake(0)
    broadcasts = [c for c in traced.collectives if c.kind == "broadcast"]
    assert sorted(c.bytes for c in broadcasts) == sorted(4 * p.numel() for p in _model().parameters())
    assert {c.phase for c in broadcasts} == {"optimizer"}
    assert sum(c.bytes for c in traced.collectives if c.kind == "all_reduce") == 4 * 808


def test_zero1_needs_data_parallel_ranks():
    with pytest.raises(UsageError, match="zero1 shards the optimizer state"):
        Execution(world=1, data="zero1").validate()
    with pytest.raises(UsageError, match="zero1 is traced for data parallelism alone"):
        Execution(world=4, data="zero1", tensor=2).validate()
