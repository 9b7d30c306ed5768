"""``nnperf measure --layout PLAN.json``: a planned layout run for real, one process per rank
under ``torchrun``, its per-rank figures beside the plan's.

Every rank builds the model (the same seed everywhere), applies the layout's engines with the
code the planner traces them with (``trace.parallel.apply_layout``: ``parallelize_module``,
expert parallelism, FSDP2 or DDP, ZeRO-1's distributed optimizer over DDP, on a device
mesh of the real process group: NCCL on GPUs, gloo on CPUs) and runs the step: ``grad_accum``
micro-batches' forward and backward, then the optimizer. What each rank measures, gathered on rank 0:

- step time: the median of ``steps`` steps after ``warmup`` (``measure.device.time_repeats``:
  CUDA events on a GPU, ``perf_counter`` on a CPU);
- per-rank parameter, gradient and optimizer-state bytes (the local shards' storages, the
  gradients as the optimizer step begins): the plan's ``per_rank_state_bytes``, exactly;
- peak memory: ``max_memory_allocated`` and ``max_memory_reserved`` on a GPU (the plan's figure
  is the device total it predicts; the reserved bytes are the nearest measured), the CPU
  allocator's peak on a CPU (``measure.host_memory``);
- exposed communication, on a GPU: in one profiled step, the time NCCL kernels run while no
  other kernel does (communication nothing hides). A CPU has no kernel timeline: not measured.

Pipeline and context-parallel layouts are not run yet (their schedules and ring attention are
the planner's, traced or in closed form).
"""

from __future__ import annotations

import contextlib
import gc
import os
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch
import torch.distributed as dist

from nnperf.errors import UsageError
from nnperf.layout import Execution
from nnperf.loading import resolve
from nnperf.measure.device import device_name, synchronize, time_repeats
from nnperf.measure.stats import Spread
from nnperf.request import ModelRequest
from nnperf.trace.options import TraceOptions
from nnperf.trace.step import gradient_params, optimizer_state


@dataclass
class RankMeasurement:
    """One rank's measured figures."""

    rank: int
    device_name: str
    step_times_s: list[float]
    state_bytes: dict[str, int]
    peak_memory_bytes: int | None
    peak_reserved_bytes: int | None
    memory_method: str
    exposed_communication_s: float | None
    communication_s: float | None

    @property
    def step_s(self) -> float:
        return Spread.of(self.step_times_s).median

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "step_time_s": self.step_s}


@dataclass
class LayoutMeasurement:
    """Every rank's figures for one layout."""

    execution: Execution
    device: str
    backend: str
    ranks: list[RankMeasurement] = field(default_factory=list)

    @property
    def step_s(self) -> float:
        """The step as the job sees it: the slowest rank's median (collectives wait for it)."""
        return max(r.step_s for r in self.ranks)

    def to_json(self) -> dict[str, Any]:
        return {"layout": self.execution.describe(), "execution": self.execution.to_json(), "device": self.device,
                "backend": self.backend, "step_time_s": self.step_s, "ranks": [r.to_json() for r in self.ranks]}


def check_model(request: ModelRequest, plan: dict[str, Any], path: str) -> None:
    """The measured model must be the planned one, compared as resolved, not as spelled: a
    built-in's configuration and sequence length after its defaults and ``-O`` (``--seq`` left
    out is gpt2's 1024, which the plan records; ``-O n_layer=2`` is the integer 2 however
    written); another model's ``-O`` values and ``--seq`` as given."""
    planned = _resolved_model(request.target, plan.get("model_options") or {}, plan.get("seq_len"))
    mine = _resolved_model(request.target, dict(request.overrides), request.seq_len)
    differ = [k for k in sorted(set(planned) | set(mine)) if planned.get(k) != mine.get(k)]
    if differ:
        raise UsageError(f"--layout {path} was planned for another model: "
                         + "; ".join(f"{k} planned {planned.get(k)!r}, got {mine.get(k)!r}" for k in differ)
                         + "; measure with the plan's -O and --seq")


def _resolved_model(target: Any, overrides: dict[str, Any], seq_len: int | None) -> dict[str, Any]:
    """The settings that make the model: a built-in's built config and sequence length (built
    on the meta device at batch 1), else the ``-O`` values (as text) and ``--seq``."""
    from nnperf.zoo import find_model

    spec = find_model(target) if isinstance(target, str) else None
    if spec is None:
        return {**{f"-O {k}": str(v) for k, v in overrides.items()}, "--seq": seq_len}
    with torch.device("meta"):
        info = spec.build(1, seq_len, **overrides).info
    return {**info.get("config", {}), "seq_len": info.get("seq_len")}


def measure_layout(request: ModelRequest, options: TraceOptions, execution: Execution, device_kind: str | None,
                   steps: int = 10, warmup: int = 3) -> LayoutMeasurement | None:
    """Run ``execution`` on this torchrun job; rank 0 returns every rank's figures, the others None."""
    world = int(os.environ.get("WORLD_SIZE", "0") or 0)
    if world == 0:
        raise UsageError(f"--layout runs one process per rank: start it with torchrun, e.g. 'torchrun "
                         f"--nproc_per_node={execution.world} -m nnperf measure ... --layout PLAN.json'")
    if world != execution.world:
        raise UsageError(f"the layout has {execution.world} ranks ({execution.describe()}); this torchrun job "
                         f"has {world}: use --nproc_per_node/--nnodes for {execution.world} processes")
    if execution.pipeline > 1 or execution.context > 1:
        raise UsageError("pipeline and context-parallel layouts are not measured yet; data, tensor and expert "
                         "parallel layouts are")
    execution.validate()
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
    use_cuda = device_kind != "cpu" and torch.cuda.is_available()
    if device_kind == "cuda" and not use_cuda:
        raise UsageError("--device cuda: no CUDA device here; use --device cpu (gloo)")
    device = torch.device("cuda", local) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    backend = "nccl" if use_cuda else "gloo"
    started = not dist.is_initialized()
    if started:
        dist.init_process_group(backend)
    try:
        mine = _measure_rank(request, options, execution, device, rank, steps, warmup)
        gathered: list[Any] = [None] * world if rank == 0 else []
        dist.gather_object(mine, gathered if rank == 0 else None, dst=0)
        dist.barrier()
    finally:
        # The step's modules, meshes and the engines' pending work hold the process groups in
        # reference cycles; freed at interpreter exit instead, a gloo worker thread released a
        # tensor after the interpreter had gone and the rank aborted ("terminate called without
        # an active exception", once in CI; PyTorch #179291 describes the same teardown race).
        gc.collect()
        if started:
            dist.destroy_process_group()
    if rank != 0:
        return None
    return LayoutMeasurement(execution, device.type, backend, sorted(gathered, key=lambda r: r.rank))


def _measure_rank(request: ModelRequest, options: TraceOptions, execution: Execution, device: torch.device,
                  rank: int, steps: int, warmup: int) -> RankMeasurement:
    from nnperf.measure import host_memory
    from nnperf.measure.step import build_step
    from nnperf.search.plan import prepare_for
    from nnperf.trace.blocks import repeated_blocks
    from nnperf.trace.parallel import apply_layout, build_meshes

    if device.type == "cpu":
        options = replace(options, autocast_device="cpu")
    meshes = build_meshes(execution, device.type)
    contexts = contextlib.ExitStack()
    _, build = resolve(replace(request, batch=execution.micro_batch))
    torch.manual_seed(0)  # every rank builds the same weights; the engines shard them
    step = build_step(build, options, device, wrap=lambda w: apply_layout(
        w, execution, options, meshes, repeated_blocks, prepare_for(execution), contexts, real=True))
    grads = _GradientBytes(step.optimizer)
    run = _accumulating(step, execution.grad_accum)
    with contexts:  # what the step runs under (loss parallelism), entered while the engines wrapped it
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        times = time_repeats(run, device, warmup=warmup, repeats=steps)
        synchronize(device)
        if device.type == "cuda":
            peak, reserved = int(torch.cuda.max_memory_allocated(device)), int(torch.cuda.max_memory_reserved(device))
            method = "torch.cuda.max_memory_allocated / max_memory_reserved"
            comm, exposed = _communication(run, device)
        else:
            local_state = lambda: [_local(t) for t in step.state_tensors() if isinstance(t, torch.Tensor)]  # noqa: E731
            peak, reserved, method = host_memory.peak_tensor_bytes(run, local_state), None, host_memory.METHOD
            comm = exposed = None
    state = {"parameters": _storage_bytes(step.workload.model.parameters()), "gradients": grads.bytes,
             "optimizer_state": _storage_bytes(v for s in (optimizer_state(step.optimizer).values() if step.optimizer else ())
                                               for v in s.values() if isinstance(v, torch.Tensor))}
    return RankMeasurement(rank, device_name(device), times, state, peak, reserved, method, exposed, comm)


def _accumulating(real: Any, accum: int) -> Any:
    """The planned step: ``accum - 1`` micro-batches' forward and backward, then the last one
    with the optimizer. DDP (and ZeRO-1 on it) runs the first ones under ``no_sync``, so the
    gradients are reduced once, in the last micro-batch's backward, as Megatron-LM's data
    parallelism does and the plan times it; FSDP2 reduce-scatters every micro-batch, as
    torchtitan runs it."""
    from torch.nn.parallel import DistributedDataParallel

    from nnperf.trace.step import sdpa_backend

    step = real.step
    model = step.model
    quiet = model.no_sync if isinstance(model, DistributedDataParallel) else contextlib.nullcontext

    def run() -> None:
        with sdpa_backend(step.options.sdpa):  # as Step.run runs the last micro-batch
            for _ in range(accum - 1):
                with quiet():
                    with step.autocast():
                        loss = step.loss_fn(model(*step.inputs))
                    (step.scaler.scale(loss) if step.scaler is not None else loss).backward()
        real.run()
    return run


class _GradientBytes:
    """Gradient bytes of this rank's shards as the optimizer step begins (after it, the loop's
    ``zero_grad`` frees them)."""

    def __init__(self, optimizer: torch.optim.Optimizer | None) -> None:
        self.bytes = 0
        if optimizer is not None:
            optimizer.register_step_pre_hook(self._seen)

    def _seen(self, optimizer: torch.optim.Optimizer, *args: Any) -> None:
        self.bytes = _storage_bytes(p.grad for p in gradient_params(optimizer) if p.grad is not None)


def _local(t: torch.Tensor) -> torch.Tensor:
    while hasattr(t, "_local_tensor"):  # DTensor: this rank's shard
        t = t._local_tensor
    return t


def _storage_bytes(tensors: Any) -> int:
    return sum({id(_local(t).untyped_storage()): _local(t).untyped_storage().nbytes() for t in tensors}.values())


def _communication(run: Any, device: torch.device) -> tuple[float, float]:
    """Seconds NCCL kernels ran in one profiled step, and of those the seconds no other kernel
    ran beside them (after a profiled warm-up step)."""
    from torch.profiler import ProfilerActivity, profile, schedule

    with profile(activities=[ProfilerActivity.CUDA], schedule=schedule(wait=0, warmup=1, active=1)) as prof:
        for _ in range(2):
            run()
            synchronize(device)
            prof.step()
    kernels = [(e.time_range.start, e.time_range.end, "nccl" in e.name.lower()) for e in prof.events()
               if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start]
    comm = [(s, e) for s, e, is_comm in kernels if is_comm]
    compute = _union([(s, e) for s, e, is_comm in kernels if not is_comm])
    total = sum(e - s for s, e in _union(comm))
    hidden = sum(max(0, min(e, ce) - max(s, cs)) for s, e in _union(comm) for cs, ce in compute)
    return total * 1e-6, (total - hidden) * 1e-6  # profiler times are microseconds


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out
