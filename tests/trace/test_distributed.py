"""One rank's step under DDP and FSDP2, traced on a fake process group, against the same
step run for real by torch.distributed on CPU with gloo in 2 processes: per-rank parameter,
gradient and optimizer-state bytes, and the kind, group and bytes of every collective of a
steady-state step, in order. The real run is the engines' own; nothing here is copied from
nnperf's output."""

from __future__ import annotations

import pytest
import torch
from gloo_ranks import SeenCollectives, run_ranks, wrap_data_parallel
from torch import nn

from nnperf.layout import Execution
from nnperf.trace.distributed import sharded_bytes, trace_rank
from nnperf.trace.options import TraceOptions
from nnperf.workload import Workload

pytestmark = pytest.mark.process

WORLD = 2
BUCKET = 1000  # bytes: small enough that DDP makes two buckets of this model


def _model() -> nn.Sequential:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))


def _bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    def local(t):
        return getattr(t, "_local_tensor", t)

    def total(ts):
        return sum({id(local(t).untyped_storage()): local(t).untyped_storage().nbytes() for t in ts}.values())

    return {
        "parameters": total(model.parameters()),
        "gradients": total(p.grad for p in model.parameters()),
        "optimizer_state": total(v for s in optimizer.state.values() for v in s.values()),
    }


def _worker(rank: int) -> dict:
    results = {}
    for kind in ("ddp", "fsdp"):
        torch.manual_seed(0)
        model = _model()
        step_model = wrap_data_parallel(model, kind, BUCKET)
        optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
        for _ in range(3):  # the third step is the steady state (DDP rebuilds after the first)
            seen = SeenCollectives()
            with seen:
                step_model(torch.randn(4, 16)).sum().backward()
                optimizer.step()
            state = _bytes(model, optimizer)
            optimizer.zero_grad()
        results[kind] = (seen.seen, state)
    return results


@pytest.fixture(scope="module")
def real_runs():
    return run_ranks(_worker, WORLD, timeout_s=120)[0]


def _fake(kind: str):
    def build() -> Workload:
        return Workload(model=_model(), inputs=(torch.randn(4, 16),), loss_fn=lambda out: out.sum())

    if kind == "ddp":
        execution = Execution(world=WORLD, data="ddp", bucket_bytes=BUCKET)
    else:
        execution = Execution(world=WORLD, data="fsdp", shard=WORLD)
    return trace_rank(build, TraceOptions(optimizer="adamw"), execution, lambda model: ["0", "2"])


@pytest.mark.parametrize("kind", ["ddp", "fsdp"])
def test_fake_process_group_reproduces_gloo(real_runs, kind):
    real_collectives, real_bytes = real_runs[kind]
    traced = _fake(kind)
    assert [(c.kind, c.bytes) for c in traced.collectives] == real_collectives
    assert all(c.group_size == WORLD for c in traced.collectives)
    assert sharded_bytes(traced) == real_bytes


def test_fsdp_state_is_zero3_closed_form():
    """ZeRO-3 with Adam in fp32: 16 bytes per parameter split over N ranks (4 weights, 4
    gradients, 8 moments), plus AdamW's 4-byte step counter per parameter tensor."""
    traced = _fake("fsdp")
    psi = sum(p.numel() for p in _model().parameters())  # 808, every tensor divisible by 2
    assert sum(sharded_bytes(traced).values()) == 16 * psi // WORLD + 4 * 4


def test_ddp_all_reduces_every_gradient_once():
    traced = _fake("ddp")
    psi = sum(p.numel() for p in _model().parameters())
    assert sum(c.bytes for c in traced.collectives) == 4 * psi
    assert {c.phase for c in traced.collectives} == {"backward"}


@pytest.mark.parametrize("kind", ["ddp", "fsdp"])
@pytest.mark.parametrize("selective", [False, True])
def test_activation_checkpointing_inside_a_layout(kind, selective):
    """Checkpointed blocks under DDP/FSDP2: the blocks' forward runs again in backward (more
    matrix products there), the collectives are those of the plain step."""
    from nnperf.search.memory_variants import apply_checkpointing
    from nnperf.trace.blocks import repeated_blocks
    from nnperf.zoo import get_model

    def build() -> Workload:
        return get_model("gpt2").build(batch=2, seq_len=16, n_layer=2, n_embd=32, n_head=2, vocab=64)

    execution = Execution(world=WORLD, data=kind, shard=1 if kind == "ddp" else WORLD)
    options = TraceOptions(optimizer="adamw")
    plain = trace_rank(build, options, execution, repeated_blocks)
    checkpointed = trace_rank(build, options, execution, repeated_blocks,
                              prepare=lambda w: apply_checkpointing(w, selective=selective))

    def backward_mms(rank):
        return sum(e.phase == "backward" and e.name in ("aten.mm", "aten.addmm") for e in rank.trace.events)

    assert backward_mms(checkpointed) > backward_mms(plain) or selective
    assert len(checkpointed.trace.events) > len(plain.trace.events)
    assert [(c.kind, c.bytes) for c in checkpointed.collectives] == [(c.kind, c.bytes) for c in plain.collectives]


def test_fsdp_gathered_parameters_live_between_all_gather_and_reshard():
    """FSDP2 frees a gathered block by resizing its storage to 0 bytes (reshard after forward)
    and gathers it again for backward; the recorder follows the resizes, so each gathered
    weight is an allocation of its own: with resharding, every block's forward copy dies before
    backward starts and backward gathers it again; without, the forward copy lives into backward."""
    blocks, width = 6, 256

    def build() -> Workload:
        model = nn.Sequential(*(nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(blocks)))
        return Workload(model=model, inputs=(torch.randn(2, width),), loss_fn=lambda out: out.sum())

    def gathered(reshard: bool) -> tuple[list[tuple[str, int]], int]:
        execution = Execution(world=WORLD, data="fsdp", shard=WORLD, reshard_after_forward=reshard)
        traced = trace_rank(build, TraceOptions(optimizer="adamw"), execution,
                            lambda model: [str(i) for i in range(blocks)]).trace
        last_forward = max(e.index for e in traced.events if e.phase == "forward")
        weights = [(traced.events[i.created_by].phase, i.released_after) for i in traced.storages.values()
                   if i.created_by is not None and i.nbytes == width * width * 4 and i.kind.value == "activation"
                   and traced.events[i.created_by].name == "aten.empty"]  # FSDP's unsharded weights
        return weights, last_forward

    weights, last_forward = gathered(True)
    forward = [released for phase, released in weights if phase == "forward"]
    assert len(forward) == blocks and all(released < last_forward for released in forward)
    weights, last_forward = gathered(False)
    assert len(weights) == blocks and all(released > last_forward for _, released in weights)


def test_a_view_after_fsdp_reallocates_storage_is_still_free():
    """FSDP2 resizes the unsharded parameters' storages back to size before copying a gathered
    block out; the allocation starts at the next recorded op, which in backward is the view of
    the all-gather output (``all_gather_output.view(world_size, -1)``, torch's
    ``foreach_all_gather_copy_out``). That view launches no kernel: it must stay free (it was
    timed as a copy of the whole gathered block)."""
    blocks, width = 3, 64

    def build() -> Workload:
        model = nn.Sequential(*(nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(blocks)))
        return Workload(model=model, inputs=(torch.randn(2, width),), loss_fn=lambda out: out.sum())

    execution = Execution(world=WORLD, data="fsdp", shard=WORLD)
    events = trace_rank(build, TraceOptions(), execution, lambda m: [str(i) for i in range(blocks)]).trace.events
    views = [e for e in events if e.name == "aten.view" and e.phase == "backward"]
    assert any(e.allocates for e in views)  # the case in question occurs
    assert all(e.free for e in views)


def test_megatron_layouts_attend_through_transformer_engine():
    """A layout only Megatron-LM runs (ZeRO-1) is timed with Transformer Engine's attention
    checks (``kernels.attention.can_use_te_cudnn``), one torchtitan runs (FSDP2) with PyTorch's."""
    assert _traced_engine("zero1") == "transformer-engine"
    assert _traced_engine("fsdp") is None


def test_megatron_layouts_run_experts_through_transformer_engine():
    """Megatron-Core's experts are Transformer Engine's GroupedLinear (``TEGroupedMLP``), timed
    as its GEMMs per group over four streams (``kernels.grouped_gemm``); torchtitan's FSDP2
    layouts keep PyTorch's ``_grouped_mm``."""
    assert _traced_engine("zero1", "linear_engine") == "transformer-engine"
    assert _traced_engine("fsdp", "linear_engine") is None


def _traced_engine(kind: str, key: str = "attention_engine") -> str | None:
    def build() -> Workload:
        return Workload(model=_model(), inputs=(torch.randn(4, 16),), loss_fn=lambda out: out.sum())

    execution = Execution(world=WORLD, data=kind)
    traced = trace_rank(build, TraceOptions(optimizer="adamw"), execution, lambda model: ["0", "2"])
    return traced.trace.config.get(key)
