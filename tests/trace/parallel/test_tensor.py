"""Tensor parallelism (with and without sequence parallelism, logits split over the vocabulary for
a loss-parallel cross entropy where the family allows it) traced on a fake process group,
against the same step run for real by torch.distributed with gloo in 2 processes: per-rank
parameter, gradient and optimizer-state bytes (the storages each rank holds) and the kind,
group, bytes and order of every collective of a steady-state step, on both ranks. The real
run applies the same ``parallelize_module`` plan to real tensors; the collectives are seen by
a dispatch mode of the test's own, sized from the real tensors."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.distributed as dist
from gloo_ranks import run_ranks
from torch.distributed.tensor.parallel import loss_parallel
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass_type

from nnperf.errors import UsageError
from nnperf.layout import Execution
from nnperf.trace.distributed import sharded_bytes, trace_rank
from nnperf.trace.options import TraceOptions

pytestmark = pytest.mark.process

WORLD = 2
CASES = {  # name: (zoo model, options, sequence parallel)
    "llama-tp": ("llama-7b", {"n_layer": 2, "dim": 32, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 48,
                              "vocab": 101}, False),
    "llama-tp-sp": ("llama-7b", {"n_layer": 2, "dim": 32, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 48,
                                 "vocab": 101}, True),
    "nemotron-tp-sp": ("llama-7b", {"n_layer": 2, "dim": 32, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 48,
                                    "vocab": 101, "mlp": "squared-relu", "norm": "layernorm"}, True),
    "gpt2-tp-sp": ("gpt2", {"n_layer": 1, "n_embd": 32, "n_head": 4, "vocab": 100, "n_positions": 16}, True),
    "bert-tp": ("bert-base", {"n_layer": 1, "n_embd": 32, "n_head": 4, "intermediate": 64, "vocab": 100,
                              "max_positions": 16}, False),
    "bert-tp-sp": ("bert-base", {"n_layer": 1, "n_embd": 32, "n_head": 4, "intermediate": 64, "vocab": 100,
                                 "max_positions": 16}, True),
}
BATCH, SEQ = 2, 8

# The test's own table: functional collectives (DTensor) and c10d ones, and which side is
# nccl-tests' size (all-gather: the gathered output; the others: the input).
_KIND = {"_c10d_functional.all_reduce": ("all_reduce", "in"),
         "_c10d_functional.all_gather_into_tensor": ("all_gather", "out"),
         "_c10d_functional.reduce_scatter_tensor": ("reduce_scatter", "in"),
         "c10d.allreduce_": ("all_reduce", "in")}


class _Collectives(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, int, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(is_traceable_wrapper_subclass_type(t) for t in types):
            return NotImplemented  # a DTensor: see the collectives on its local tensors
        out = func(*args, **(kwargs or {}))
        name = f"{func.namespace}.{func._schema.name.split('::')[1]}"
        if name in _KIND:
            kind, side = _KIND[name]
            if func.namespace == "c10d":  # (output, input, group, ...); all-reduce: (tensors, group, ...)
                tensor = args[1] if side == "in" and kind == "reduce_scatter" else args[0]
            else:  # functional: (input, ..., group name) -> output
                tensor = out if side == "out" else args[0]
            tensor = tensor[0] if isinstance(tensor, list) else tensor
            self.seen.append((kind, tensor.numel() * tensor.element_size(), _ranks(args)))
        return out


def _ranks(args) -> tuple[int, ...]:
    for a in reversed(args):
        if isinstance(a, str):  # a functional collective names its group
            return tuple(dist.get_process_group_ranks(dist.distributed_c10d._resolve_process_group(a)))
        if isinstance(a, torch.ScriptObject) and "ProcessGroup" in str(a._type()):
            return tuple(dist.get_process_group_ranks(dist.ProcessGroup.unbox(a)))
    raise AssertionError("a collective without a group")


def _storage_bytes(model, optimizer) -> dict[str, int]:
    def local(t):
        return getattr(t, "_local_tensor", t)

    def total(ts):
        return sum({id(local(t).untyped_storage()): local(t).untyped_storage().nbytes() for t in ts}.values())

    return {"parameters": total(model.parameters()),
            "gradients": total(p.grad for p in model.parameters()),
            "optimizer_state": total(v for s in optimizer.state.values() for v in s.values())}


def _worker(rank: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    from nnperf.trace.parallel.tensor import apply_tensor_parallel
    from nnperf.zoo import get_model

    mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("tensor",))
    results = {}
    for case, (name, options, sp) in CASES.items():
        torch.manual_seed(0)
        workload = get_model(name).build(batch=BATCH, seq_len=SEQ, **options)
        split = apply_tensor_parallel(workload.model, mesh["tensor"], sp, loss_parallel=True)
        optimizer = torch.optim.AdamW(workload.model.parameters(), foreach=True)
        for _ in range(2):  # the second step is the steady state (Adam's state exists)
            seen = _Collectives()
            with seen, loss_parallel() if split else contextlib.nullcontext():
                workload.loss_fn(workload.model(*workload.inputs)).backward()
                optimizer.step()
            state = _storage_bytes(workload.model, optimizer)
            optimizer.zero_grad()
        results[case] = (seen.seen, state)
    # what a functional collective's wait returns on real tensors: the buffer itself
    buffer = torch.ops._c10d_functional.all_reduce(torch.ones(4), "sum", mesh["tensor"].get_group().group_name)
    waited = torch.ops._c10d_functional.wait_tensor(buffer)
    results["wait_returns_buffer"] = waited.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
    return results


@pytest.fixture(scope="module")
def real_runs():
    return run_ranks(_worker, WORLD, timeout_s=120)


def _traced(case: str, rank: int):
    from nnperf.zoo import get_model

    name, options, sp = CASES[case]
    execution = Execution(world=WORLD, tensor=WORLD, sequence_parallel=sp)
    return trace_rank(lambda: get_model(name).build(batch=BATCH, seq_len=SEQ, **options),
                      TraceOptions(optimizer="adamw"), execution, lambda model: [], rank=rank)


@pytest.mark.parametrize("rank", range(WORLD))
@pytest.mark.parametrize("case", list(CASES))
def test_fake_process_group_reproduces_gloo(real_runs, case, rank):
    real_collectives, real_bytes = real_runs[rank][case]
    traced = _traced(case, rank)
    assert [(c.kind, c.bytes, c.group_ranks) for c in traced.collectives] == real_collectives
    assert sharded_bytes(traced) == real_bytes


def test_waiting_on_a_collective_allocates_nothing(real_runs):
    """A fake ``wait_tensor`` returns a new tensor; the real one returns the collective's
    buffer, so the trace records its result as that storage, not a second activation."""
    assert real_runs[0]["wait_returns_buffer"]
    trace = _traced("llama-tp-sp", 0).trace
    waits = [e for e in trace.events if e.name == "_c10d_functional.wait_tensor"]
    assert waits
    for e in waits:
        assert e.allocates == [] and e.outputs[0].storage == e.inputs[0].storage


def test_megatron_collectives_per_block():
    """Megatron's count (Shoeybi et al. 2019, Korthikanti et al. 2022): per block and direction
    two all-reduces of the activations (b x s x h) without SP; with SP each becomes an
    all-gather plus a reduce-scatter of the same size. Here: the llama case's forward."""
    activation = BATCH * SEQ * CASES["llama-tp"][1]["dim"] * 4
    plain = [c for c in _traced("llama-tp", 0).collectives if c.phase == "forward" and c.module.startswith("layers.")]
    assert [(c.kind, c.bytes) for c in plain] == [("all_reduce", activation)] * 2 * 2
    sp = [c for c in _traced("llama-tp-sp", 0).collectives if c.phase == "forward" and c.module.startswith("layers.")]
    assert [(c.kind, c.bytes) for c in sp] == [("all_gather", activation), ("reduce_scatter", activation)] * 2 * 2


def test_a_half_precision_model_is_cast_before_the_engine_wraps_it():
    """``--dtype bf16`` on a tensor-parallel layout (Megatron-LM's Float16Module): the all-gathers
    and reduce-scatters move 2-byte activations, and each rank's shards are bf16."""
    from nnperf.zoo import get_model

    name, options, _ = CASES["llama-tp-sp"]
    traced = trace_rank(lambda: get_model(name).build(batch=BATCH, seq_len=SEQ, **options),
                        TraceOptions(optimizer="adamw", dtype="bf16"),
                        Execution(world=WORLD, tensor=WORLD, sequence_parallel=True), lambda model: [])
    activation = BATCH * SEQ * options["dim"] * 2
    sp = [c for c in traced.collectives if c.phase == "forward" and c.module.startswith("layers.")]
    assert [(c.kind, c.bytes) for c in sp] == [("all_gather", activation), ("reduce_scatter", activation)] * 2 * 2
    assert {p.dtype for p in traced.workload.model.parameters()} == {torch.bfloat16}


def test_heads_tp_does_not_divide_is_one_line():
    from nnperf.zoo import get_model

    name, options, _ = CASES["llama-tp"]
    execution = Execution(world=3, tensor=3)
    with pytest.raises(UsageError, match=r"tensor parallel degree 3 does not divide n_heads = 4 .* "
                                         r"nearest valid degrees: 2$"):
        trace_rank(lambda: get_model(name).build(batch=BATCH, seq_len=SEQ, **options),
                   TraceOptions(optimizer="adamw"), execution, lambda model: [])


FSDP_TP = ("llama-7b", {"n_layer": 2, "dim": 32, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 48, "vocab": 101})


def _worker_2d(rank: int) -> tuple:
    """FSDP2 over tensor parallelism with sequence parallelism on a 2 x 2 mesh, torchtitan's
    order: TP first, then ``fully_shard`` per block and the root on the data-parallel mesh."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from nnperf.trace.parallel.tensor import apply_tensor_parallel
    from nnperf.zoo import get_model

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("shard", "tensor"))
    torch.manual_seed(0)
    name, options = FSDP_TP
    workload = get_model(name).build(batch=BATCH, seq_len=SEQ, **options)
    model = workload.model
    assert apply_tensor_parallel(model, mesh["tensor"], True, loss_parallel=True)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh["shard"])
    fully_shard(model, mesh=mesh["shard"], reshard_after_forward=False)
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    for _ in range(2):
        seen = _Collectives()
        with seen, loss_parallel():
            workload.loss_fn(model(*workload.inputs)).backward()
            optimizer.step()
        state = _storage_bytes(model, optimizer)
        optimizer.zero_grad()
    return seen.seen, state


_KIND.update({"c10d._allgather_base_": ("all_gather", "out"), "c10d._reduce_scatter_base_": ("reduce_scatter", "in"),
              "c10d.allgather_into_tensor_coalesced_": ("all_gather", "out"),
              "c10d.reduce_scatter_tensor_coalesced_": ("reduce_scatter", "in")})


@pytest.fixture(scope="module")
def real_2d():
    return run_ranks(_worker_2d, 4, timeout_s=180)


@pytest.mark.parametrize("rank", [0, 3])
def test_fsdp_over_tensor_parallel_reproduces_gloo(real_2d, rank):
    from nnperf.zoo import get_model

    name, options = FSDP_TP
    execution = Execution(world=4, data="fsdp", shard=2, tensor=2, sequence_parallel=True)
    traced = trace_rank(lambda: get_model(name).build(batch=BATCH, seq_len=SEQ, **options),
                        TraceOptions(optimizer="adamw"), execution, lambda model: ["layers.0", "layers.1"],
                        rank=rank)
    real_collectives, real_bytes = real_2d[rank]
    assert [(c.kind, c.bytes, c.group_ranks) for c in traced.collectives] == real_collectives
    assert sharded_bytes(traced) == real_bytes
