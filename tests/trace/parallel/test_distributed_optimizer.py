"""ZeRO-1 as Megatron-LM's distributed optimizer on DDP (trace.parallel.distributed_optimizer),
data parallelism alone: one rank traced on a fake process group against the same step run for
real by torch.distributed on CPU with gloo in 3 processes (buckets that 3 ranks do not divide),
per rank its parameter, gradient and optimizer-state bytes and every collective, in order; the
update against one AdamW step of the whole model on the ranks' averaged gradients, computed on
one process; each rank's share of every bucket."""

from __future__ import annotations

import contextlib
from collections import Counter

import pytest
import torch
from gloo_ranks import SeenCollectives, run_ranks
from torch import nn

from nnperf.errors import UsageError
from nnperf.layout import Execution
from nnperf.passes.memory.model import predict_memory
from nnperf.trace.distributed import sharded_bytes, trace_rank
from nnperf.trace.options import TraceOptions
from nnperf.vocab import StorageKind
from nnperf.workload import Workload

pytestmark = pytest.mark.process

WORLD = 3
EXECUTION = Execution(world=WORLD, data="zero1", bucket_bytes=400)  # buckets of 100 fp32 elements
OPTIONS = TraceOptions(optimizer="adamw")


def _workload() -> Workload:
    return Workload(model=_small(), inputs=(torch.zeros(4, 16),), loss_fn=lambda out: out.sum())


def _real_step(execution: Execution, options: TraceOptions = OPTIONS):
    from nnperf.measure.step import build_step
    from nnperf.trace.parallel import apply_layout, build_meshes

    meshes = build_meshes(execution)
    torch.manual_seed(0)
    return build_step(_workload, options, torch.device("cpu"), wrap=lambda w: apply_layout(
        w, execution, options, meshes, lambda m: [], None, contextlib.ExitStack(), real=True))


def _worker(rank: int) -> tuple[list[tuple[str, int]], dict[str, int]]:
    step = _real_step(EXECUTION)
    step.step.zero_grad = False

    def storage_bytes(tensors):
        return sum({id(t.untyped_storage()): t.untyped_storage().nbytes() for t in tensors}.values())

    for n in range(3):  # the third step is the steady state (DDP rebuilds its buckets after the first)
        step.step.inputs = (_samples(rank, n),)
        seen = SeenCollectives()
        with seen:
            step.run()
        params = list(step.workload.model.parameters())
        state = {"parameters": storage_bytes(params), "gradients": storage_bytes(p.grad for p in params),
                 "optimizer_state": storage_bytes(v for s in step.optimizer.state.values() for v in s.values())}
        step.optimizer.zero_grad(set_to_none=True)
    return seen.seen, state


@pytest.fixture(scope="module")
def real_runs():
    return run_ranks(_worker, WORLD, timeout_s=120)


@pytest.mark.slow
@pytest.mark.parametrize("rank", range(WORLD))
def test_fake_process_group_reproduces_gloo(real_runs, rank):
    real_collectives, real_bytes = real_runs[rank]
    traced = trace_rank(_workload, OPTIONS, EXECUTION, lambda m: [], rank=rank)
    assert [(c.kind, c.bytes) for c in traced.collectives] == real_collectives
    assert sharded_bytes(traced) == real_bytes


@pytest.mark.slow
def test_zero1_is_one_adamw_step_on_the_averaged_gradients():
    """3 steps on 2 ranks, each fed its own samples, against AdamW on one process over the mean
    of the two ranks' gradients (its weights 16x33 and 33x5: the bias of 33 elements leaves a
    bucket of an odd size, whose last element every rank updates)."""
    results = run_ranks(_zero1_worker, 2, timeout_s=120)
    torch.manual_seed(0)
    reference = _small()
    optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-3)
    for step in range(3):
        grads = []
        for rank in range(2):
            reference.zero_grad()
            reference(_samples(rank, step)).sum().backward()
            grads.append([p.grad.clone() for p in reference.parameters()])
        for p, a, b in zip(reference.parameters(), *grads, strict=True):
            p.grad = (a + b) / 2
        optimizer.step()
    expected = [p.detach() for p in reference.parameters()]
    for rank in range(2):
        for got, want in zip(results[rank], expected, strict=True):
            torch.testing.assert_close(got, want)


def _small() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 33), nn.ReLU(), nn.Linear(33, 5))


def _samples(rank: int, step: int) -> torch.Tensor:
    return torch.randn(4, 16, generator=torch.Generator().manual_seed(100 * step + rank))


def _zero1_worker(rank: int) -> list[torch.Tensor]:
    step = _real_step(Execution(world=2, data="zero1", bucket_bytes=400))
    for n in range(3):
        step.step.inputs = (_samples(rank, n),)
        step.run()
    step.optimizer.finish()
    return [p.detach().clone() for p in step.workload.model.module.parameters()]


def test_zero1_shares_each_bucket_evenly():
    """The 16x33 + 33 + 33x5 + 5 elements of the small model in buckets of at most 100 elements,
    2 ranks: each rank's optimizer state is its half of every bucket (an odd bucket's last
    element on both), 2 fp32 moments per element and AdamW's 4-byte step per share."""
    traced = trace_rank(_workload, OPTIONS, Execution(world=2, data="zero1", bucket_bytes=400), lambda m: [])
    sizes = [b.bytes // 4 for b in traced.collectives if b.kind == "reduce_scatter"]
    assert sum(sizes) + sum(c.bytes // 4 for c in traced.collectives if c.kind == "all_reduce") == 16 * 33 + 33 + 33 * 5 + 5
    shares = sum(n // 2 + n % 2 for n in _bucket_sizes(traced))
    tensors = len(_bucket_sizes(traced)) + sum(n % 2 for n in _bucket_sizes(traced))
    assert sharded_bytes(traced)["optimizer_state"] == 8 * shares + 4 * tensors


def _bucket_sizes(traced, itemsize: int = 4) -> list[int]:
    """Each bucket's elements: a reduce-scatter's input, and the odd element all-reduced after it."""
    sizes: list[int] = []
    for c in traced.collectives:
        if c.kind == "reduce_scatter":
            sizes.append(c.bytes // itemsize)
        elif c.kind == "all_reduce" and c.phase == "backward":
            sizes[-1] += c.bytes // itemsize
    return sizes


BF16 = TraceOptions(optimizer="adamw", dtype="bf16")


@pytest.mark.parametrize(("fp32_gradients", "gradient_bytes"), [(False, 2), (True, 4)])
def test_zero1_of_a_bf16_model_keeps_fp32_main_parameters(fp32_gradients, gradient_bytes):
    """Megatron-LM's distributed optimizer on a bf16 model: the parameters in bf16 (2 bytes an
    element, 731 of them), the gradients held and reduce-scattered in bf16, or with fp32 main
    gradients (``grad_reduce_in_fp32``, Megatron's) in fp32 (4 bytes); per element of this
    rank's shares an fp32 main parameter and two fp32 moments (12 bytes) either way, besides
    AdamW's 4-byte step per share."""
    execution = Execution(world=2, data="zero1", bucket_bytes=200, grad_reduce_in_fp32=fp32_gradients)
    traced = trace_rank(_workload, BF16, execution, lambda m: [])
    total = 16 * 33 + 33 + 33 * 5 + 5
    sizes = _bucket_sizes(traced, itemsize=gradient_bytes)
    assert sum(sizes) == total
    shares = sum(n // 2 + n % 2 for n in sizes)
    tensors = len(sizes) + sum(n % 2 for n in sizes)
    assert sharded_bytes(traced) == {"parameters": 2 * total, "gradients": gradient_bytes * total,
                                     "optimizer_state": 12 * shares + 4 * tensors}


@pytest.mark.slow
@pytest.mark.parametrize("states", ["fp32", "bf16"])
def test_zero1_of_a_bf16_model_steps_as_its_states_say(states):
    """3 steps of the bf16 model on 2 ranks against AdamW on one process, fed the two ranks'
    bf16 gradients averaged as the buckets average them (each halved, then summed, in bf16):
    with fp32 states (Megatron-LM's) over fp32 copies of the weights, rounded to bf16 after
    each step; with bf16 states (Apex's DistributedFusedAdam in bf16 beside a bf16 model, as
    NeMo runs it) over the bf16 weights themselves. Bit for bit, and not the other one."""
    results = run_ranks(_bf16_states_worker if states == "bf16" else _bf16_worker, 2, timeout_s=120)
    through_fp32, plain = _bf16_references()
    expected, other = (plain, through_fp32) if states == "bf16" else (through_fp32, plain)
    for rank in range(2):
        for got, want in zip(results[rank], expected, strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert any(not torch.equal(got, o) for got, o in zip(results[0], other, strict=True))


def _bf16_references(fp32_average: bool = False) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The small bf16 model's weights after 3 AdamW steps on one process, fed the two ranks'
    bf16 gradients averaged as the buckets average them: through fp32 copies of the weights
    (rounded back to bf16 after each step), and on the bf16 weights themselves. ``fp32_average``:
    the fp32 copies fed the average of the gradients cast to fp32 (fp32 main gradients)."""
    torch.manual_seed(0)
    model = _small().to(torch.bfloat16)
    main = [p.detach().float().requires_grad_() for p in model.parameters()]
    optimizer = torch.optim.AdamW(main, lr=1e-3)
    plain = [p.detach().clone().requires_grad_() for p in model.parameters()]
    plain_optimizer = torch.optim.AdamW(plain, lr=1e-3)
    for step in range(3):
        grads = []
        for rank in range(2):
            model.zero_grad()
            model(_samples(rank, step).to(torch.bfloat16)).sum().backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for m, q, a, b in zip(main, plain, *grads, strict=True):
            averaged = a / 2 + b / 2
            m.grad = a.float() / 2 + b.float() / 2 if fp32_average else averaged.float()
            q.grad = averaged
        optimizer.step()
        plain_optimizer.step()
        with torch.no_grad():
            for p, m in zip(model.parameters(), main, strict=True):
                p.copy_(m)
    return [m.detach().to(torch.bfloat16) for m in main], [q.detach() for q in plain]


def test_fp32_main_gradients_hold_no_16_bit_copy_and_are_clipped_in_fp32():
    """With fp32 main gradients (``grad_reduce_in_fp32``) on the bf16 model, 2 ranks: DDP's bf16
    buckets beside the fp32 buffer are stand-ins not held (2 bytes an element, traced, kind
    unheld, on no device in the memory model, which holds the fp32 buffer's 4); clipping's norm
    reads the fp32 main gradients of the shares, as Megatron clips them."""
    execution = Execution(world=2, data="zero1", bucket_bytes=200, grad_reduce_in_fp32=True)
    traced = trace_rank(_workload, BF16, execution, lambda m: [])
    total = 16 * 33 + 33 + 33 * 5 + 5
    shares = sum(n // 2 + n % 2 for n in _bucket_sizes(traced, itemsize=4))
    unheld = [s for s in traced.trace.storages.values() if s.kind == StorageKind.UNHELD_GRADIENT]
    assert sum(s.nbytes for s in unheld) == 2 * total
    assert predict_memory(traced.trace).model_states["gradients"] == 4 * total
    clipped = trace_rank(_workload, TraceOptions(optimizer="adamw", dtype="bf16", clip_grad_norm=1.0), execution,
                         lambda m: [])
    norms = [e for e in clipped.trace.events if e.name == "aten._foreach_norm"]
    assert norms and all(t.dtype == torch.float32 for e in norms for t in e.inputs if t.shape)
    assert sum(t.numel for e in norms for t in e.inputs if t.shape) == shares


def test_fp32_main_gradients_refuse_what_cannot_hold_them():
    """Each one line: DDP and FSDP reduce in the model's dtype; Apex's bf16 states keep no fp32
    main parameter to hand the gradients to."""
    for data in ("ddp", "fsdp"):
        with pytest.raises(UsageError, match=f"it needs zero1 \\({data} reduces"):
            Execution(world=2, data=data, grad_reduce_in_fp32=True).validate()
    with pytest.raises(UsageError, match="optimizer states bf16 keep none: valid: fp32, bf16-moments"):
        Execution(world=2, data="zero1", optimizer_states="bf16", grad_reduce_in_fp32=True).validate()


@pytest.mark.slow
def test_fp32_main_gradients_step_on_the_fp32_average():
    """3 steps of the bf16 model on 2 ranks with fp32 main gradients against AdamW on one
    process over fp32 copies of the weights, fed the two ranks' bf16 gradients averaged in fp32
    (each cast, halved, summed): bit for bit, and not the bf16-averaged reference."""
    results = run_ranks(_fp32_gradients_worker, 2, timeout_s=120)
    expected, _ = _bf16_references(fp32_average=True)
    for rank in range(2):
        for got, want in zip(results[rank], expected, strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    through_bf16, _ = _bf16_references()
    assert any(not torch.equal(got, o) for got, o in zip(results[0], through_bf16, strict=True))


def _fp32_gradients_worker(rank: int) -> list[torch.Tensor]:
    return _bf16_worker(rank, grad_reduce_in_fp32=True)


def _bf16_states_worker(rank: int) -> list[torch.Tensor]:
    return _bf16_worker(rank, "bf16")


def _bf16_worker(rank: int, states: str = "fp32", grad_reduce_in_fp32: bool = False) -> list[torch.Tensor]:
    step = _real_step(Execution(world=2, data="zero1", bucket_bytes=200, optimizer_states=states,
                                grad_reduce_in_fp32=grad_reduce_in_fp32), BF16)
    for n in range(3):
        step.step.inputs = (_samples(rank, n).to(torch.bfloat16),)
        step.run()
    step.optimizer.finish()
    return [p.detach().clone() for p in step.workload.model.module.parameters()]


@pytest.mark.parametrize(("states", "per_element"), [("fp32", 4 + 4 + 4), ("bf16-moments", 4 + 2 + 2), ("bf16", 2 + 2)])
def test_optimizer_states_hold_their_bytes_per_element_of_a_share(states, per_element):
    """Per element of this rank's shares of the bf16 model (2 ranks): Megatron-LM's fp32 main
    parameter and moments (12 bytes), its precision-aware optimizer's fp32 main parameter and
    bf16 moments (8), Apex's bf16 state beside a bf16 model, the moments alone (4); AdamW's
    4-byte step per share in each. The parameters and gradients stay the model's, in bf16."""
    execution = Execution(world=2, data="zero1", bucket_bytes=200, optimizer_states=states)
    traced = trace_rank(_workload, BF16, execution, lambda m: [])
    sizes = _bucket_sizes(traced, itemsize=2)
    shares = sum(n // 2 + n % 2 for n in sizes)
    tensors = len(sizes) + sum(n % 2 for n in sizes)
    total = 16 * 33 + 33 + 33 * 5 + 5
    assert sharded_bytes(traced) == {"parameters": 2 * total, "gradients": 2 * total,
                                     "optimizer_state": per_element * shares + 4 * tensors}


def test_bf16_moments_step_in_one_fused_adam_over_both_dtypes():
    """The precision-aware optimizer's step is one fused kernel per dtype group, as Transformer
    Engine's FusedAdam is: the traced optimizer runs PyTorch's fused AdamW, reading fp32 main
    parameters and gradients and bf16 moments."""
    execution = Execution(world=2, data="zero1", bucket_bytes=200, optimizer_states="bf16-moments")
    traced = trace_rank(_workload, BF16, execution, lambda m: [])
    steps = [e for e in traced.trace.events if e.phase == "optimizer" and "adam" in e.name]
    assert [e.name for e in steps] == ["aten._fused_adamw_"]
    sizes = _bucket_sizes(traced, itemsize=2)
    shares = len(sizes) + sum(n % 2 for n in sizes)
    # per share: its main parameter, gradient and step in fp32, its two moments in bf16
    assert Counter(t.dtype for t in steps[0].inputs) == {torch.float32: 3 * shares, torch.bfloat16: 2 * shares}


def test_optimizer_states_refuse_what_they_cannot_hold():
    """Each a line: bf16 states update a bf16 model's own weights (an fp32 model has none to
    update); bf16 moments are Adam's; only ZeRO-1's distributed optimizer has them; a measured
    layout runs PyTorch's AdamW, not Transformer Engine's FusedAdam."""
    with pytest.raises(UsageError, match="need a model in bf16"):
        trace_rank(_workload, OPTIONS, Execution(world=2, data="zero1", optimizer_states="bf16"), lambda m: [])
    with pytest.raises(UsageError, match="need adam or adamw"):
        trace_rank(_workload, TraceOptions(optimizer="sgd-momentum", dtype="bf16"),
                   Execution(world=2, data="zero1", optimizer_states="bf16-moments"), lambda m: [])
    for data in ("ddp", "fsdp"):
        with pytest.raises(UsageError, match="need zero1"):
            Execution(world=2, data=data, optimizer_states="bf16-moments").validate()
    with pytest.raises(UsageError, match="unknown optimizer states 'fp16'; valid: fp32, bf16-moments, bf16"):
        Execution(world=2, data="zero1", optimizer_states="fp16").validate()
    with pytest.raises(UsageError, match="planned, not run on GPUs"):
        _real_step(Execution(world=2, data="zero1", optimizer_states="bf16-moments"), BF16)


def test_zero1_runs_with_a_grad_scaler_on_an_fp32_model():
    """--amp fp16 keeps the fp32 weights (no main copies) and scales the loss: the shares are
    unscaled like any parameter, so the step traces, holding the fp32 layout's bytes (2 fp32
    moments per share element, AdamW's step per share). A 16-bit model's main gradients exist
    only inside the step: that with a GradScaler is one line."""
    execution = Execution(world=2, data="zero1", bucket_bytes=400)
    traced = trace_rank(_workload, TraceOptions(optimizer="adamw", amp="fp16"), execution, lambda m: [])
    sizes = _bucket_sizes(traced)
    shares = sum(n // 2 + n % 2 for n in sizes)
    assert sharded_bytes(traced)["optimizer_state"] == 8 * shares + 4 * (len(sizes) + sum(n % 2 for n in sizes))
    with pytest.raises(UsageError, match="zero1 of a 16-bit model"):
        trace_rank(_workload, TraceOptions(optimizer="adamw", dtype="bf16", grad_scaler=True), execution,
                   lambda m: [])


def test_zero1_runs_on_any_data_parallel_ranks_and_a_schedule_ddp_can_run():
    # over one rank it shards nothing, as Megatron-LM's distributed optimizer runs there
    # (search.plan.main_params counts its states whole)
    Execution(world=1, data="zero1").validate()
    assert Execution(world=8, data="zero1", tensor=8).megatron_only
    with pytest.raises(UsageError, match="zero-bubble schedule is not modelled"):
        Execution(world=4, data="zero1", pipeline=2, pipeline_schedule="zero-bubble", virtual_stages=2,
                  grad_accum=2).validate()
    Execution(world=8, data="zero1", tensor=2, pipeline=2, pipeline_schedule="1f1b", grad_accum=2).validate()
