"""The host time DTensor adds to an op: measured on the host itself, with no device needed.

Tensor parallelism (``parallelize_module``) and FSDP2's optimizer step run their ops on
DTensors, a ``__torch_dispatch__`` subclass: before each op's local kernel is launched, Python
unwraps the arguments, looks the sharding up (or propagates it), redistributes where needed
and wraps the outputs. That costs the host tens of microseconds an op ("DTensor being a
__torch_dispatch__ subclass and having its own dispatch overhead": pytorch/pytorch#134191;
torchtitan PR #1587 removed DTensor ops from the MoE token path because "training sometimes is
CPU bounded"), more than a plain op's whole dispatch, and small layouts become host-bound.

Two microbenchmarks, each a difference between the same work on DTensors and on plain
tensors (so the plain ops' own cost, charged as ``host_dispatch_s``, is left out):

* per dispatch: a two-block Llama with torchtitan's tensor-parallel plan (the same
  ``apply_tensor_parallel`` the traces use) over 8 ranks, forward and backward, against the
  same model unsplit; the difference over the DTensor dispatches counted. It folds in what the
  parallel styles do around the ops (their hooks, redistributions, the functional collectives'
  Python), as a traced layout runs them;
* per tensor of a list: ``torch._foreach_mul_`` over 16 and 256 DTensor shards against plain
  tensors, the slope (a foreach optimizer step on FSDP2's sharded parameters).

Tiny CPU tensors and a fake process group: only the host's work is timed, the same whatever
device the kernels would run on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from nnperf.measure.stats import Spread

#: The fake world the benchmark's DTensors live in (torchtitan's tensor degree of a node).
WORLD = 8
#: The two-block Llama of the per-dispatch benchmark: tiny, so the CPU kernels cost little.
_LLAMA = {"n_layer": 2, "dim": 64, "n_heads": 8, "n_kv_heads": 8, "ffn_hidden": 128, "vocab": 256}
_LIST_SIZES = (16, 256)


def dtensor_overheads(repeats: int = 7, steps: int = 20) -> dict[str, Any]:
    """``{"dispatch_s": Spread JSON, "list_tensor_s": Spread JSON, "dispatches": n}``, or {} where
    torch.distributed is missing or a process group is already up (its world is not ours)."""
    import torch.distributed as dist

    if not dist.is_available() or dist.is_initialized():
        return {}
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WORLD)
    try:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (WORLD,))
        per_dispatch, dispatches = _per_dispatch(mesh, repeats, steps)
        return {"dispatch_s": per_dispatch.to_json(), "list_tensor_s": _per_list_tensor(mesh, repeats).to_json(),
                "dispatches": dispatches}
    finally:
        dist.destroy_process_group()


def _per_dispatch(mesh: Any, repeats: int, steps: int) -> tuple[Spread, int]:
    from nnperf.trace.parallel.tensor import apply_tensor_parallel
    from nnperf.zoo import get_model

    def build(split: bool) -> Callable[[], None]:
        torch.manual_seed(0)
        workload = get_model("llama-7b").build(batch=1, seq_len=16, **_LLAMA)
        if split:
            apply_tensor_parallel(workload.model, mesh, sequence_parallel=True)

        def step() -> None:
            out = workload.model(*workload.inputs)
            out = out.full_tensor() if hasattr(out, "full_tensor") else out
            out.float().sum().backward()
        return step

    split, plain = build(True), build(False)
    dispatches = _count_dispatches(split)
    samples = [(_seconds(split, steps) - _seconds(plain, steps)) / dispatches for _ in range(repeats)]
    return Spread.of(samples), dispatches


def _per_list_tensor(mesh: Any, repeats: int) -> Spread:
    from torch.distributed.tensor import Shard, distribute_tensor

    def extra(n: int) -> float:
        plain = [torch.randn(8) for _ in range(n)]
        split = [distribute_tensor(torch.randn(8 * WORLD), mesh, [Shard(0)]) for _ in range(n)]
        return (_seconds(lambda: torch._foreach_mul_(split, 0.5), 50)
                - _seconds(lambda: torch._foreach_mul_(plain, 0.5), 50))

    small, large = _LIST_SIZES
    return Spread.of([(extra(large) - extra(small)) / (large - small) for _ in range(repeats)])


def _seconds(fn: Callable[[], object], n: int) -> float:
    """Seconds per call of ``fn``, over ``n`` calls after a warm-up (caches filled)."""
    for _ in range(max(2, n // 5)):
        fn()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n


def _count_dispatches(fn: Callable[[], None]) -> int:
    """DTensor (any wrapper subclass) dispatches of one call, as the trace recorder meets them."""
    from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass_type

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if any(is_traceable_wrapper_subclass_type(t) for t in types):
                Count.n += 1
                return NotImplemented
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return Count.n
