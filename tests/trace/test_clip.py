"""Gradient clipping in the step (``--clip-grad-norm``, ``trace.clip``): the gradients it leaves
against PyTorch's own ``clip_grad_norm_``, the kernels the trace records, and the collectives of
one rank against torchtitan's clipping run for real by torch.distributed on CPU with gloo."""

from __future__ import annotations

import pytest
import torch
from gloo_ranks import SeenCollectives, run_ranks, wrap_data_parallel
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from nnperf.analysis import analyze
from nnperf.errors import UsageError
from nnperf.layout import Execution
from nnperf.trace.clip import CLIP_MODULE, clip_grad_norm
from nnperf.trace.distributed import trace_rank
from nnperf.trace.options import TraceOptions
from nnperf.workload import Workload

pytestmark = pytest.mark.process

WORLD = 2


def _model() -> nn.Sequential:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))


@pytest.mark.parametrize("max_norm", [1e-3, 1e3])
def test_gradients_match_torch_clip_grad_norm(max_norm):
    """Real tensors: the gradients after clipping and the norm returned are PyTorch's (a tiny
    limit scales them, a large one leaves them)."""
    torch.manual_seed(0)
    ours, ref = _model(), _model()
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(4, 16)
    for m in (ours, ref):
        m(x).square().sum().backward()
    norm = clip_grad_norm(list(ours.parameters()), max_norm)
    expected = torch.nn.utils.clip_grad_norm_(ref.parameters(), max_norm)
    assert norm == pytest.approx(expected.item(), rel=1e-6)
    for a, b in zip(ours.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad)


def test_the_trace_reads_every_gradient_for_the_norm_and_scales_each_once():
    """Between backward and the optimizer, under the (clip_grad_norm) pseudo-module: one foreach
    norm over the gradients, then one foreach multiply that writes each of them; nothing else of
    the step changes."""
    model = _model()
    grads = {id(p) for p in model.parameters()}
    plain = analyze(model, torch.randn(4, 16))
    clipped = analyze(model, torch.randn(4, 16), clip_grad_norm=1.0)
    ops = [e for e in clipped.trace.events if e.module == CLIP_MODULE]
    assert ops and {e.phase for e in ops} == {"backward"}
    norm = next(e for e in ops if e.name == "aten._foreach_norm")
    scale = next(e for e in ops if e.name == "aten._foreach_mul_")
    assert len(norm.inputs) == len(grads)  # every gradient read once
    shapes = sorted(tuple(p.shape) for p in model.parameters())
    assert sorted(tuple(t.shape) for t in norm.inputs) == shapes
    assert sorted(tuple(t.shape) for t in scale.inputs if t.shape) == shapes  # and the 0-dim coefficient
    first_optimizer = next(i for i, e in enumerate(clipped.trace.events) if e.phase == "optimizer")
    assert max(clipped.trace.events.index(e) for e in ops) < first_optimizer
    outside = [e.name for e in clipped.trace.events if e.module != CLIP_MODULE]
    assert outside == [e.name for e in plain.trace.events]


@pytest.mark.parametrize("options, message", [
    (TraceOptions(clip_grad_norm=0.0), "--clip-grad-norm 0.0: the largest gradient norm must be a number > 0"),
    (TraceOptions(clip_grad_norm=1.0, optimizer="none"), "needs a training step with an optimizer"),
    (TraceOptions(clip_grad_norm=1.0, train=False), "needs a training step with an optimizer"),
])
def test_a_clipping_no_step_can_run_is_refused(options, message):
    with pytest.raises(UsageError, match=message):
        options.validate()


def _clip_like_torchtitan(model: nn.Module, max_norm: float) -> None:
    """torchtitan/distributed/utils.py ``clip_grad_norm_`` without pipeline or experts."""
    from torch.distributed.tensor import DTensor

    params = list(model.parameters())
    norm = torch.nn.utils.get_total_norm([p.grad for p in params], 2.0, False, True)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm, True)


def _dtensor_all_reduces() -> TorchDispatchMode:
    """The all-reduces DTensor issues while it redistributes, as (kind, bytes of the reduced
    tensor). DTensor runs them where a plain dispatch mode does not see them (SeenCollectives
    misses them), but shows them to its own CommDebugMode."""
    from torch.distributed.tensor.debug import CommDebugMode

    class Seen(CommDebugMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[tuple[str, int]] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops._c10d_functional.all_reduce.default:
                self.seen.append(("all_reduce", args[0].numel() * args[0].element_size()))
            return super().__torch_dispatch__(func, types, args, kwargs)

    return Seen()


def _worker(rank: int) -> dict:
    results = {}
    for kind in ("ddp", "fsdp"):
        torch.manual_seed(0)
        model = _model()
        step_model = wrap_data_parallel(model, kind)
        optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
        for _ in range(3):  # the steady state (DDP rebuilds its buckets after the first)
            seen, in_clipping = SeenCollectives(), _dtensor_all_reduces()
            with seen:
                step_model(torch.randn(4, 16)).sum().backward()
                with in_clipping:
                    _clip_like_torchtitan(model, 1.0)
                optimizer.step()
            optimizer.zero_grad()
        results[kind] = seen.seen + in_clipping.seen
    return results


@pytest.fixture(scope="module")
def real_runs():
    return run_ranks(_worker, WORLD, timeout_s=120)[0]


@pytest.mark.parametrize("kind", ["ddp", "fsdp"])
def test_one_ranks_collectives_match_torchtitans_clipping_on_gloo(real_runs, kind):
    """DDP's gradients are whole on every rank: no collective for the norm. FSDP2's are shards:
    after the reduce-scatters, one all-reduce makes the stacked per-gradient norms whole (DTensor
    redistributes the input of the vector norm: four fp32 norms, 16 bytes)."""
    def build() -> Workload:
        return Workload(model=_model(), inputs=(torch.randn(4, 16),), loss_fn=lambda out: out.sum())

    execution = (Execution(world=WORLD, data="ddp") if kind == "ddp"
                 else Execution(world=WORLD, data="fsdp", shard=WORLD))
    traced = trace_rank(build, TraceOptions(optimizer="adamw", clip_grad_norm=1.0), execution,
                        lambda model: ["0", "2"])
    assert [(c.kind, c.bytes) for c in traced.collectives] == real_runs[kind]
    if kind == "fsdp":
        assert real_runs[kind][-1] == ("all_reduce", 4 * 4)


def test_an_accumulated_step_clips_once():
    """Clipping runs once per optimizer step, after the last micro-batch: with 4 micro-batches
    it adds what it adds to one. On this tiny model the step is host-bound, and the accumulated
    step is the host's total: 4 micro-batches' dispatch, the optimizer's and clipping's once."""
    from nnperf.hardware.catalog import load_gpu
    from nnperf.hardware.cluster import load_cluster
    from nnperf.request import ModelRequest
    from nnperf.search.plan import evaluate
    from nnperf.search.plan.rank import RoleCache

    request = ModelRequest("llama-7b", batch=2, seq_len=64,
                           overrides={"n_layer": 2, "dim": 64, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 128,
                                      "vocab": 256})
    gpu, cluster = load_gpu("h100"), load_cluster("dgx-h100")

    def planned(accum: int, clip: float | None):
        execution = Execution(world=8, data="fsdp", shard=8, micro_batch=2, grad_accum=accum)
        return evaluate(request, TraceOptions(clip_grad_norm=clip), execution, gpu, cluster, layers=2,
                        cache=RoleCache())

    one = planned(1, 1.0).step_s - planned(1, None).step_s
    four_clipped, four = planned(4, 1.0), planned(4, None)
    assert one > 0
    assert four_clipped.step_s - four.step_s == pytest.approx(one, rel=0.05)
    assert four.step_s == pytest.approx(four.split.host_s, rel=0.01)
