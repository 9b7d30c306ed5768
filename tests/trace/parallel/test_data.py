"""DDP and ZeRO-1 (Megatron-LM's distributed optimizer on DDP) beside tensor and pipeline
parallelism: one rank traced on a fake process group against the same layout run for real by
torch.distributed with gloo on 4 CPU processes (2 data-parallel ranks x 2 tensor-parallel ranks
or pipeline stages): per rank, parameter, gradient and optimizer-state bytes and every
collective but the pipeline's sends (kind and bytes), in order, of a steady-state step. And
ZeRO-1's update on 2 ranks fed different samples, which must be one AdamW step of the whole
model on the ranks' averaged gradients, computed here on one process."""

from __future__ import annotations

import contextlib
from dataclasses import replace

import pytest
import torch
from gloo_ranks import SeenCollectives, run_ranks

from nnperf.layout import Execution
from nnperf.trace.distributed import sharded_bytes, trace_rank
from nnperf.trace.options import TraceOptions
from nnperf.workload import Workload

pytestmark = pytest.mark.process

WORLD = 4
BUCKET = 20_000  # bytes: several buckets of this model, some not divisible by 2 ranks
LLAMA = {"n_layer": 4, "dim": 32, "n_heads": 4, "n_kv_heads": 4, "ffn_hidden": 48, "vocab": 65}
OPTIONS = TraceOptions(optimizer="adamw", clip_grad_norm=1.0)
CASES = {
    "ddp-tp": Execution(world=WORLD, data="ddp", tensor=2, sequence_parallel=True, micro_batch=2,
                        bucket_bytes=BUCKET),
    "zero1-tp": Execution(world=WORLD, data="zero1", tensor=2, sequence_parallel=True, micro_batch=2,
                          bucket_bytes=BUCKET),
    "ddp-pp": Execution(world=WORLD, data="ddp", pipeline=2, pipeline_schedule="1f1b", micro_batch=1,
                        grad_accum=2, bucket_bytes=BUCKET),
    "zero1-pp": Execution(world=WORLD, data="zero1", pipeline=2, pipeline_schedule="interleaved-1f1b",
                          virtual_stages=2, micro_batch=1, grad_accum=2, bucket_bytes=BUCKET),
}


def _build(execution: Execution) -> Workload:
    from nnperf.zoo import get_model

    return get_model("llama-7b").build(batch=execution.micro_batch * execution.grad_accum, seq_len=16, **LLAMA)


def _real(execution: Execution) -> tuple[list[tuple[str, int]], dict[str, int]]:
    from nnperf.measure.step import build_step
    from nnperf.trace.blocks import repeated_blocks
    from nnperf.trace.parallel import apply_layout, build_meshes
    from nnperf.trace.step import optimizer_state

    torch.manual_seed(0)
    meshes = build_meshes(execution)
    contexts = contextlib.ExitStack()
    step = build_step(lambda: _build(execution), OPTIONS, torch.device("cpu"), wrap=lambda w: apply_layout(
        w, execution, OPTIONS, meshes, repeated_blocks, None, contexts, real=True))

    def storage_bytes(tensors):
        return sum({id(t.untyped_storage()): t.untyped_storage().nbytes() for t in tensors}.values())

    step.step.zero_grad = False  # the state is read after the optimizer, before gradients are dropped
    with contexts:
        for _ in range(3):  # the third step is the steady state (DDP rebuilds its buckets after the first)
            seen = SeenCollectives(functional=True)
            with seen:
                step.run()
            params = [p for p in step.workload.model.parameters() if p.requires_grad]
            state = {"parameters": storage_bytes(params),
                     "gradients": storage_bytes(p.grad for p in params if p.grad is not None),
                     "optimizer_state": storage_bytes(v for s in optimizer_state(step.optimizer).values()
                                                      for v in s.values() if isinstance(v, torch.Tensor))}
            step.optimizer.zero_grad(set_to_none=True)
    return seen.seen, state


def _worker(rank: int) -> dict:
    return {case: _real(execution) for case, execution in CASES.items()}


@pytest.fixture(scope="module")
def real_runs():
    return run_ranks(_worker, WORLD, timeout_s=300)


@pytest.mark.slow
@pytest.mark.parametrize("rank", range(WORLD))
@pytest.mark.parametrize("case", list(CASES))
def test_fake_process_group_reproduces_gloo(real_runs, case, rank):
    real_collectives, real_bytes = real_runs[rank][case]
    execution = CASES[case]
    traced = trace_rank(lambda: _build(execution), OPTIONS, execution, lambda m: [], rank=rank)
    assert [(c.kind, c.bytes) for c in traced.collectives if c.kind != "send_recv"] == real_collectives
    assert sharded_bytes(traced) == real_bytes


def test_ddp_beside_tensor_parallelism_reduces_over_the_data_parallel_ranks():
    """2 x 2: the buckets' all-reduces run over the 2 data-parallel ranks (0 and 2, tensor
    innermost), the tensor-parallel collectives over ranks 0 and 1; ZeRO-1's reduce-scatters and
    all-gathers move the same gradient and parameter bytes as DDP's all-reduces."""
    ddp = trace_rank(lambda: _build(CASES["ddp-tp"]), OPTIONS, CASES["ddp-tp"], lambda m: [])
    zero1 = trace_rank(lambda: _build(CASES["zero1-tp"]), OPTIONS, CASES["zero1-tp"], lambda m: [])
    grads = sharded_bytes(ddp)["gradients"]
    reduced = [c for c in ddp.collectives if c.kind == "all_reduce" and c.group_ranks == (0, 2)]
    assert sum(c.bytes for c in reduced if c.module != "(clip_grad_norm)") == grads
    assert {c.group_ranks for c in ddp.collectives if c.kind in ("all_gather", "reduce_scatter")} == {(0, 1)}
    scattered = [c for c in zero1.collectives if c.group_ranks == (0, 2) and c.kind == "reduce_scatter"]
    gathered = [c for c in zero1.collectives if c.group_ranks == (0, 2) and c.kind == "all_gather"]
    assert sum(c.bytes for c in scattered) == sum(c.bytes for c in gathered) == grads - _tails(zero1)
    assert all(c.phase == "forward" for c in gathered) and all(c.phase == "backward" for c in scattered)
    assert sharded_bytes(zero1)["optimizer_state"] < sharded_bytes(ddp)["optimizer_state"] * 0.6


def _tails(traced) -> int:
    return sum(c.bytes for c in traced.collectives if c.kind == "all_reduce" and c.group_ranks == (0, 2)
               and c.module != "(clip_grad_norm)")


def test_each_pipeline_chunk_is_its_own_ddp_reduced_in_the_last_micro_batch():
    """1F1B over 2 stages x 2 micro-batches, DDP over 2 ranks per stage: the stage's buckets are
    all-reduced once, in the backward of its last micro-batch (DDP's no_sync before it, as
    torch.distributed.pipelining runs a DDP stage), not once per micro-batch."""
    execution = CASES["ddp-pp"]
    traced = trace_rank(lambda: _build(execution), OPTIONS, execution, lambda m: [])
    grads = sharded_bytes(traced)["gradients"]
    reduced = [c for c in traced.collectives if c.kind == "all_reduce" and c.module != "(clip_grad_norm)"]
    assert sum(c.bytes for c in reduced) == grads
    backwards = [a for a in traced.trace.config["pipeline_actions"] if a[0].startswith("B")]
    last = max(backwards, key=lambda a: a[1])
    assert all(last[1] <= c.index <= last[2] for c in reduced)
    assert replace(execution, data="zero1").validate() is None
