"""Pipeline parallelism traced on a fake process group against the same step run for real by
``torch.distributed.pipelining`` with gloo in 2 processes: for GPipe, 1F1B, interleaved 1F1B
(also with rank 0's first chunk the embedding alone) and interleaved zero-bubble, per rank the parameter/gradient/optimizer bytes its stages hold,
every send and receive (direction, peer, bytes) in order, the order of the schedule's actions
and the micro-batches in flight per stage (forward done, input gradient not yet). The real run
builds its stages and schedule with torch's API directly and watches them itself."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from gloo_ranks import run_ranks
from torch.utils._python_dispatch import TorchDispatchMode

from nnperf.errors import UsageError
from nnperf.layout import Execution
from nnperf.trace.distributed import sharded_bytes, trace_rank
from nnperf.trace.options import TraceOptions

pytestmark = pytest.mark.process

WORLD = 2
MODEL = ("llama-7b", {"n_layer": 4, "dim": 32, "n_heads": 4, "ffn_hidden": 48, "vocab": 64})
BATCH, SEQ, MICRO = 8, 8, 4  # 4 micro-batches of 2
SCHEDULES = {"gpipe": 1, "1f1b": 1, "interleaved-1f1b": 2, "zero-bubble": 2}  # chunks per rank
#: each case: its schedule, chunks per rank and the first stage's blocks (None: even); rank 0's
#: first chunk of the embedding alone, as Llama 3 405B ran (chunks of 0, 2, 1 and 1 blocks)
CASES = {**{name: (name, virtual, None) for name, virtual in SCHEDULES.items()},
         "interleaved-1f1b-embedding-alone": ("interleaved-1f1b", 2, 1)}


class _P2P(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, int, tuple[int, int]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        if name in ("c10d::send", "c10d::recv_"):
            group = dist.ProcessGroup.unbox(args[1])
            peer = dist.get_process_group_ranks(group)[args[2]]
            me = dist.get_rank()
            pair = (me, peer) if name == "c10d::send" else (peer, me)
            self.seen.append(("send_recv", sum(t.numel() * t.element_size() for t in args[0]), pair))
        return func(*args, **(kwargs or {}))


def _storage_bytes(modules, optimizer) -> dict[str, int]:
    params = [p for m in modules for p in m.parameters()]

    def total(ts):
        return sum({id(t.untyped_storage()): t.untyped_storage().nbytes() for t in ts}.values())

    return {"parameters": total(params), "gradients": total(p.grad for p in params),
            "optimizer_state": total(v for s in optimizer.state.values() for v in s.values())}


def _watched(stage, actions: list[str], in_flight: dict[int, int]) -> None:
    """Record the executed actions and the largest number of micro-batches whose forward is
    cached for backward (``fwd_cache``)."""
    forward, backward, weight = stage.forward_one_chunk, stage.backward_one_chunk, stage.backward_weight_one_chunk
    index = stage.stage_index

    def f(chunk, *a, **k):
        actions.append(f"F{chunk}@{index}")
        out = forward(chunk, *a, **k)
        in_flight[index] = max(in_flight.get(index, 0), len(stage.fwd_cache))
        return out

    def b(chunk, *a, full_backward=True, **k):
        actions.append(f"{'B' if full_backward else 'I'}{chunk}@{index}")
        return backward(chunk, *a, full_backward=full_backward, **k)

    def w(chunk, *a, **k):
        actions.append(f"W{chunk}@{index}")
        return weight(chunk, *a, **k)

    stage.forward_one_chunk, stage.backward_one_chunk, stage.backward_weight_one_chunk = f, b, w


def _worker(rank: int) -> dict:
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
        ScheduleInterleavedZeroBubble,
    )

    from nnperf.layout import split_layers
    from nnperf.trace.parallel.pipeline import block_count, split, stage_shapes
    from nnperf.zoo import get_model

    results = {}
    for case, (schedule_name, virtual, first) in CASES.items():
        torch.manual_seed(0)
        name, options = MODEL
        workload = get_model(name).build(batch=BATCH, seq_len=SEQ, **options)
        tokens, targets = workload.inputs[0], workload.loss_fn.targets
        chunks = split(workload.model, split_layers(block_count(workload.model), WORLD, virtual, first))
        shapes = stage_shapes(chunks, (tokens,), BATCH // MICRO, contextlib.nullcontext)
        mine = [rank + k * WORLD for k in range(virtual)]
        stages = [PipelineStage(chunks[i], i, WORLD * virtual, torch.device("cpu"), input_args=shapes[i][0],
                                output_args=shapes[i][1]) for i in mine]

        def loss_fn(out, target):
            return F.cross_entropy(out.flatten(0, 1), target.flatten())

        if virtual == 1:
            kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule_name]
            schedule = kind(stages[0], MICRO, loss_fn=loss_fn)
        else:
            kind = {"interleaved-1f1b": ScheduleInterleaved1F1B,
                    "zero-bubble": ScheduleInterleavedZeroBubble}[schedule_name]
            schedule = kind(stages, MICRO, loss_fn=loss_fn)
        modules = [chunks[i] for i in mine]
        optimizer = torch.optim.AdamW([p for m in modules for p in m.parameters()], foreach=True)
        for step in range(2):  # the first step votes on shapes and sets up buffers
            actions: list[str] = []
            in_flight: dict[int, int] = {}
            if step == 1:
                for stage in stages:
                    _watched(stage, actions, in_flight)
            seen = _P2P()
            with seen:
                if rank == 0:  # holds the first stage
                    schedule.step(tokens)
                else:  # holds the last stage
                    schedule.step(target=targets)
                optimizer.step()
            state = _storage_bytes(modules, optimizer)
            optimizer.zero_grad()
        results[case] = (seen.seen, state, actions, in_flight)
    return results


@pytest.fixture(scope="module")
def real_runs():
    return run_ranks(_worker, WORLD, timeout_s=180)


def _traced(case: str, rank: int):
    from nnperf.zoo import get_model

    name, options = MODEL
    schedule, virtual, first = CASES[case]
    execution = Execution(world=WORLD, pipeline=WORLD, pipeline_schedule=schedule, micro_batch=BATCH // MICRO,
                          grad_accum=MICRO, virtual_stages=virtual, first_stage_layers=first)
    return trace_rank(lambda: get_model(name).build(batch=BATCH, seq_len=SEQ, **options),
                      TraceOptions(optimizer="adamw"), execution, lambda model: [], rank=rank)


@pytest.mark.parametrize("rank", range(WORLD))
@pytest.mark.parametrize("case", list(CASES))
def test_fake_process_group_reproduces_gloo(real_runs, case, rank):
    from nnperf.passes.pipeline_timeline import in_flight

    real_p2p, real_bytes, real_actions, real_in_flight = real_runs[rank][case]
    traced = _traced(case, rank)
    assert [(c.kind, c.bytes, c.group_ranks) for c in traced.collectives] == real_p2p
    assert sharded_bytes(traced) == real_bytes
    labels = [a[0] for a in traced.trace.config["pipeline_actions"]]
    assert labels == real_actions
    assert in_flight(labels) == real_in_flight


def test_layers_that_do_not_split_are_one_line():
    from nnperf.zoo import get_model

    name, options = MODEL
    execution = Execution(world=3, pipeline=3, pipeline_schedule="1f1b", micro_batch=2, grad_accum=4)
    with pytest.raises(UsageError, match="4 layers do not split evenly into 3 pipeline stages; nearest valid pipeline degrees: 2 or 4"):
        trace_rank(lambda: get_model(name).build(batch=BATCH, seq_len=SEQ, **options),
                   TraceOptions(optimizer="adamw"), execution, lambda model: [])


def test_only_the_end_chunks_may_hold_no_block():
    """The first chunk holds the embedding and the last the head, so either may hold no block;
    a chunk between them without one would be a stage of nothing."""
    from nnperf.trace.parallel.pipeline import split
    from nnperf.zoo import get_model

    name, options = MODEL
    model = get_model(name).build(batch=BATCH, seq_len=SEQ, **options).model
    assert [len(c.layers) for c in split(model, (0, 2, 2, 0))] == [0, 2, 2, 0]
    with pytest.raises(UsageError, match="a split of 1\\+0\\+2\\+1 blocks does not hold"):
        split(model, (1, 0, 2, 1))


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_every_ranks_order_is_what_the_engine_runs(real_runs, schedule):
    """The simulation's order of every rank (from the schedule's own plan, or the single-stage
    loops) is the order the real run executed."""
    from nnperf.passes.pipeline_timeline import orders

    ir = _traced(schedule, 0).trace.config["pipeline_order"]
    planned = orders(schedule, WORLD, MICRO, ir)
    for rank in range(WORLD):
        assert [a.label for a in planned[rank]] == real_runs[rank][schedule][2]
