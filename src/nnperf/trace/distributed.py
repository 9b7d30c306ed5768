"""One rank's step of a multi-GPU layout, traced with PyTorch's own engines.

``Execution`` is the one explicit record of a layout (as Calculon records one): world size, how the
data-parallel degree is split into replicas and shards, the tensor-parallel degree (with or
without sequence parallelism), pipeline, context and expert parallelism. ``trace_rank`` builds
the model on fake tensors, applies the real engines (``parallelize_module`` with the model
family's plan, ``trace.tensor_parallel``; then ``DistributedDataParallel`` or FSDP2's
``fully_shard`` on the data-parallel part of the device mesh) under a fake process group
(``torch.testing._internal.distributed.fake_pg``) and records one step of one rank: its shard
sizes, optimizer state and every collective, in order, come from the engine, not from a
closed form. Data- and tensor-parallel ranks all play the same role (up to uneven shards of a
vocabulary, which ``rank`` selects), so one trace is the whole layout.

Three things the engines do on real tensors only are handled here, each the engine's own
code path:
- DDP checks that every rank has the same parameter shapes by reading their data; on a fake
  process group every rank is this one, so the check is skipped.
- DDP's C++ all-reduce hook reads its future's value, which a fake collective has none of:
  a Python hook does the same all-reduce (``c10d.allreduce_`` on the bucket, then DDP
  divides by the world size as its default hook does).
- DDP rebuilds its buckets after the first step in the order gradients became ready;
  ``_steady_state_reducer`` computes that order on a warm-up backward and builds the reducer
  with the engine's own bucket assignment (``dist._compute_bucket_assignment_by_size``), so
  the traced step is the steady state a real run reaches from its second step.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import itertools
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from nnperf.errors import UsageError
from nnperf.trace.capture import cast_workload, local, trace_workload
from nnperf.trace.collectives import COLLECTIVES, collective_bytes
from nnperf.trace.events import Trace
from nnperf.trace.fsdp_shards import one_rank_chunks
from nnperf.trace.options import TraceOptions
from nnperf.trace.recorder import GraphLabeler, ModuleStack, unrecorded
from nnperf.trace.step import OPTIMIZER_SHARES, SHARDS_OPTIMIZER
from nnperf.workload import Workload, default_loss

DATA_PARALLEL = ("ddp", "zero1", "fsdp", "hsdp")
#: DDP's defaults (torch.nn.parallel.DistributedDataParallel): 25 MiB buckets, the first 1 MiB.
DDP_BUCKET_BYTES = 25 * 1024 * 1024

#: Activation checkpointing of every repeated block: "full" recomputes the whole block in
#: backward; the selective policies recompute part of it (search.memory_variants): "selective"
#: nnperf's (weight matmuls and fused attention kept, the rest recomputed), "selective-op"
#: torchtitan's per-op policy (every second matmul of a block recomputed too),
#: "selective-op-recompute-a2a" the same list as torchtitan ran it before it saved the expert
#: all-to-alls (2025; they and their host syncs run again in backward),
#: "selective-attention" Megatron-LM's --recompute-activations (the core attention only).
CHECKPOINTS = ("full", "selective", "selective-op", "selective-op-recompute-a2a", "selective-attention")


@dataclass(frozen=True)
class Execution:
    """How a step runs on many GPUs: the layout and the loop settings that change it.

    ``world = replicate * shard * tensor * pipeline * context``; DDP: ``shard = 1``; FSDP
    (full shard): ``replicate = 1``; HSDP: both above 1 (shard inside a node, replicate
    across). ``expert`` divides the data-parallel ranks of expert layers (MoE).
    """

    world: int
    data: str = "ddp"  # ddp | zero1 (DDP + ZeroRedundancyOptimizer) | fsdp | hsdp
    shard: int = 1
    reshard_after_forward: bool = True  # FSDP2: free gathered parameters after forward
    gpus_per_node: int = 8
    micro_batch: int = 1  # samples per rank per micro-batch
    grad_accum: int = 1  # micro-batches per optimizer step
    checkpoint: str | None = None  # None or one of CHECKPOINTS (per repeated block)
    tensor: int = 1
    sequence_parallel: bool = False
    pipeline: int = 1
    pipeline_schedule: str | None = None  # gpipe | 1f1b | interleaved-1f1b | zero-bubble
    context: int = 1
    expert: int = 1
    bucket_bytes: int = DDP_BUCKET_BYTES
    virtual_stages: int = 1  # model chunks per pipeline rank (interleaved schedules)
    loss_parallel: bool = True  # TP without PP: logits split over the vocabulary for the loss

    @property
    def replicate(self) -> int:
        return self.world // (self.shard * self.tensor * self.pipeline * self.context)

    @property
    def replicates_parameters(self) -> bool:
        """Every data-parallel rank holds the whole parameters and gradients (DDP, and DDP with
        the optimizer state sharded: ZeRO-1)."""
        return self.data in ("ddp", "zero1")

    @property
    def data_parallel(self) -> int:
        """Ranks that each see a different slice of the batch."""
        return self.replicate * self.shard

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.grad_accum * self.data_parallel

    @property
    def splits_logits(self) -> bool:
        """torchtitan's loss parallelism: the logits stay split over the vocabulary for the loss
        (tensor parallelism without a pipeline)."""
        return self.tensor > 1 and self.pipeline == 1 and self.loss_parallel

    @property
    def model_parallel(self) -> int:
        """Ranks that hold different parts of one model replica (tensor x pipeline x context)."""
        return self.tensor * self.pipeline * self.context

    def validate(self) -> None:
        if self.checkpoint is not None and self.checkpoint not in CHECKPOINTS:
            raise UsageError(f"unknown activation checkpointing {self.checkpoint!r}; valid: {', '.join(CHECKPOINTS)}")
        if self.data not in DATA_PARALLEL:
            raise UsageError(f"unknown data parallelism '{self.data}'; valid: {', '.join(DATA_PARALLEL)}")
        if self.expert != 1:
            self._validate_expert()
        if self.context > 1 and (self.pipeline > 1 or (self.replicates_parameters and self.world > self.model_parallel)):
            raise UsageError("context parallelism is modelled with FSDP/HSDP or alone (torchtitan's "
                             "dp_shard x cp mesh), without pipeline parallelism")
        if self.pipeline > 1:
            from nnperf.trace.pipeline import MULTI, SCHEDULES

            if self.pipeline_schedule not in SCHEDULES:
                raise UsageError(f"unknown pipeline schedule {self.pipeline_schedule!r}; valid: {', '.join(SCHEDULES)}")
            if self.virtual_stages < 1 or (self.virtual_stages > 1) != (self.pipeline_schedule in MULTI):
                raise UsageError(f"{self.pipeline_schedule} runs {'2 or more' if self.pipeline_schedule in MULTI else '1'}"
                                 " model chunks per rank (virtual_stages)")
            if self.pipeline_schedule != "gpipe" and self.grad_accum < self.pipeline:
                raise UsageError(f"{self.pipeline_schedule} needs at least as many micro-batches as stages: "
                                 f"{self.grad_accum} < {self.pipeline}")
        if self.sequence_parallel and self.tensor < 2:
            raise UsageError("sequence parallelism splits what tensor parallelism replicates: it needs tensor > 1")
        if self.tensor < 1 or self.world < 1 or self.world % self.model_parallel:
            raise UsageError(f"{self.world} GPUs are not a multiple of tensor x pipeline x context = "
                             f"{self.model_parallel}")
        data_parallel = self.world // self.model_parallel
        if self.shard < 1 or data_parallel % self.shard:
            raise UsageError(f"the shard group ({self.shard}) does not divide the {data_parallel} "
                             "data-parallel ranks")
        if self.replicates_parameters and self.shard != 1:
            raise UsageError(f"{self.data} does not shard parameters: shard must be 1")
        if self.data == "zero1" and data_parallel < 2:
            raise UsageError("zero1 shards the optimizer state over the data-parallel ranks: it needs 2 or more")
        if self.replicates_parameters and (self.tensor > 1 or self.pipeline > 1) and data_parallel > 1:
            raise UsageError(f"{self.data} is traced for data parallelism alone; use fsdp or hsdp with tensor or "
                             "pipeline parallelism (torchtitan's composition)")
        if self.data == "fsdp" and self.shard != data_parallel:
            raise UsageError(f"fsdp shards over every data-parallel rank: shard must be {data_parallel}")
        if self.data == "hsdp" and not 1 < self.shard < data_parallel:
            raise UsageError("hsdp shards inside a group and replicates across groups: "
                             f"1 < shard < {data_parallel}")

    def _validate_expert(self) -> None:
        """torchtitan's expert parallelism: the expert group is carved out of the FSDP shard
        group (``dp_shard_in_ep``), the experts' weights sharded over the rest of it."""
        if self.expert < 1:
            raise UsageError(f"expert parallelism must be 1 or more, got {self.expert}")
        if self.data not in ("fsdp", "hsdp"):
            raise UsageError("expert parallelism shards experts inside the FSDP shard group: use fsdp or hsdp")
        if self.tensor > 1 or self.context > 1:
            raise UsageError("expert parallelism is modelled with data and pipeline parallelism; "
                             "with tensor or context parallelism it is not")
        if self.shard % self.expert:
            divisors = [d for d in range(1, self.shard + 1) if self.shard % d == 0]
            raise UsageError(f"expert parallelism {self.expert} does not divide the shard group of {self.shard} "
                             f"ranks; valid: {', '.join(map(str, divisors))}")

    def describe(self) -> str:
        parts = {"ddp": [f"DDP x{self.replicate}"] if self.replicate > 1 else [],
                 "zero1": [f"DDP x{self.replicate} + ZeRO-1 (optimizer state sharded)"],
                 "fsdp": [f"FSDP2 full shard x{self.shard}"],
                 "hsdp": [f"HSDP {self.replicate} replicas x {self.shard} shards"]}[self.data]
        if self.tensor > 1:
            parts.append(f"TP x{self.tensor}" + (" + SP" if self.sequence_parallel else ""))
        if self.pipeline > 1:
            chunks = f", {self.virtual_stages} chunks/rank" if self.virtual_stages > 1 else ""
            parts.append(f"PP x{self.pipeline} {self.pipeline_schedule}{chunks}")
        if self.context > 1:
            parts.append(f"CP x{self.context}")
        if self.expert > 1:
            parts.append(f"EP x{self.expert}")
        if not parts:
            parts.append("1 GPU")
        if not self.replicates_parameters and not self.reshard_after_forward:
            parts.append("no reshard after forward")
        if self.checkpoint:
            parts.append(f"{self.checkpoint} checkpointing")
        parts.append(f"micro-batch {self.micro_batch}")
        if self.grad_accum > 1:
            parts.append(f"{'micro-batches' if self.pipeline > 1 else 'accumulation'} x{self.grad_accum}")
        return ", ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "replicate": self.replicate, "data_parallel": self.data_parallel,
                "global_batch": self.global_batch}

    def mesh_shape(self) -> list[tuple[str, int]]:
        """The device mesh, outermost first (torchtitan's order: data, then tensor innermost so
        a tensor-parallel group is consecutive ranks, inside a node)."""
        shard = [("shard", self.shard)] if self.expert == 1 else \
            [("shard_mod_expert", self.shard // self.expert), ("expert", self.expert)]
        dims = {"ddp": [("replicate", self.replicate)], "zero1": [("replicate", self.replicate)], "fsdp": shard,
                "hsdp": [("replicate", self.replicate), *shard]}[self.data]
        return [("pipeline", self.pipeline), *dims, ("tensor", self.tensor)]


@dataclass(frozen=True)
class Collective:
    """One collective of the traced step, as the engine issued it."""

    index: int  # its event in the trace
    kind: str  # all_reduce | all_gather | reduce_scatter | all_to_all | broadcast | send_recv
    bytes: int  # nccl-tests size (see passes.costs.communication)
    group_size: int
    group_ranks: tuple[int, ...]
    phase: str
    module: str
    group: str = ""  # the process group's name: one NCCL communicator, one stream

    @property
    def stream(self) -> tuple[str, tuple[int, ...]]:
        """The stream it runs on: its communicator's (a point-to-point pair has its own)."""
        return (self.group, tuple(sorted(self.group_ranks)) if self.kind == "send_recv" else ())

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "bytes": self.bytes, "group_size": self.group_size,
                "phase": self.phase, "module": self.module, "index": self.index}


@dataclass
class RankTrace:
    """One rank's traced step and what the engine communicated in it."""

    execution: Execution
    trace: Trace
    workload: Workload
    collectives: list[Collective] = field(default_factory=list)


@contextlib.contextmanager
def fake_process_group(world: int, rank: int = 0) -> Iterator[None]:
    """A process group of ``world`` ranks whose collectives do nothing (this process is
    ``rank``): engines run their real code paths, shapes and groups included."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    release_session()
    if dist.is_initialized():
        raise RuntimeError("a process group is already initialized in this process")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    _clear_sharding_caches()
    try:
        yield
    finally:
        _clear_sharding_caches()
        dist.destroy_process_group()


#: The fake process group ``trace_rank`` keeps between traces of the same (world, rank): its
#: device meshes and DTensor's sharding decisions are reused by the next trace of a search
#: (DTensor recomputes them under a fake mode, ~10 ms each, hundreds per trace).
_SESSION: dict[str, Any] = {"key": None, "meshes": {}, "memo": {}}


def _session(world: int, rank: int) -> dict[str, Any]:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if _SESSION["key"] != (world, rank):
        release_session()
        if dist.is_initialized():
            raise RuntimeError("a process group is already initialized in this process")
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
        _clear_sharding_caches()
        _SESSION.update(key=(world, rank), meshes={}, memo={})
    return _SESSION


def release_session() -> None:
    """Destroy the fake process group kept between traces (the next trace makes a new one)."""
    if _SESSION["key"] is None:
        return
    _clear_sharding_caches()
    _SESSION.update(key=None, meshes={}, memo={})
    if dist.is_initialized():
        dist.destroy_process_group()


atexit.register(release_session)


def _sharding_propagator() -> Any:
    from torch.distributed.tensor import DTensor

    return DTensor._op_dispatcher.sharding_propagator


def _clear_sharding_caches() -> None:
    """DTensor caches its sharding decisions per op schema, local view shapes included: right
    in a real run (one rank per process), wrong when this process traces another rank next."""
    _sharding_propagator().propagate_op_sharding.cache_clear()
    clear = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)
    if clear is not None:
        clear()


def trace_rank(
    build: Callable[[], Workload], options: TraceOptions, execution: Execution,
    units: Callable[[nn.Module], list[str]], prepare: Callable[[Workload], Any] | None = None,
    rank: int = 0,
) -> RankTrace:
    """Trace ``rank``'s step of ``execution``. ``units``: the names of the repeated blocks FSDP2
    shards as one unit each (torchtitan's per-transformer-block wrapping); ``prepare``: applied to the
    built workload before the engine wraps it (activation checkpointing)."""
    execution.validate()
    if execution.data == "zero1" and (options.optimizer == "none" or not options.train):
        raise UsageError("zero1 shards the optimizer state, and this step has no optimizer: use ddp")
    if execution.context > 1:
        raise UsageError("context parallelism is not traced: nnperf plan models its ring attention in "
                         "closed form on a traced rank (search.plan_context)")
    if execution.pipeline > 1 and options.uses_grad_scaler():
        raise UsageError("pipeline parallelism with fp16 autocast (a GradScaler) is not traced; use --amp bf16")

    if execution.pipeline > 1:
        # torch's pipelining makes a tensor when it is first imported (microbatch.py's
        # sum_reducer): imported before the fake mode and the recorder, or the first pipeline
        # trace of a process would record it and the next ones not
        import torch.distributed.pipelining  # noqa: F401

    session = _session(execution.world, rank)
    # torchtitan's loss parallelism (the logits stay split over the vocabulary) needs the loss
    # and its backward under ``loss_parallel()``: the whole step runs under it; its custom
    # handlers touch only cross entropy's ops on DTensors
    step_contexts = contextlib.ExitStack()
    with _quiet_sharding_propagation(session["memo"]), one_rank_chunks():
        # The mesh is made on real tensors (it reads its rank table), before the fake mode.
        shape = tuple(execution.mesh_shape())
        if shape not in session["meshes"]:
            session["meshes"][shape] = _meshes(execution)

        def build_distributed() -> Workload:
            # --dtype casts the model before the engines wrap it, as Megatron-LM's Float16Module
            # does: their shards, stage shapes and buckets are in that dtype
            workload = cast_workload(build(), options.dtype)
            return wrap_workload(workload, execution, options, session["meshes"][shape], units, prepare,
                                 step_contexts)

        with step_contexts:
            trace, workload = trace_workload(build_distributed, options, meta_first=False)
        collectives = _collectives(trace)
    trace.config["execution"] = execution.to_json()
    trace.config["rank"] = rank
    if hasattr(workload.model, OPTIMIZER_SHARES):
        trace.config["optimizer_shares"] = getattr(workload.model, OPTIMIZER_SHARES)
        trace.config["optimizer_largest"] = max(p.numel() for p in workload.model.parameters() if p.requires_grad)
    if execution.pipeline > 1:
        trace.config["pipeline_order"] = workload.model.pipeline_order
        trace.config["pipeline_stages"] = list(workload.model.stage_indices)
    return RankTrace(execution, trace, workload, collectives)


def wrap_workload(workload: Workload, execution: Execution, options: TraceOptions, meshes: tuple[Any, ...],
                  units: Callable[[nn.Module], list[str]], prepare: Callable[[Workload], Any] | None,
                  step_contexts: contextlib.ExitStack, real: bool = False) -> Workload:
    """Apply the layout's engines to a built workload, in torchtitan's order: tensor and expert
    parallelism, activation checkpointing (``prepare``), the pipeline stages, then DDP or FSDP2.
    ``meshes``: ``_meshes(execution)``; ``step_contexts`` receives what the step must run under
    (loss parallelism); ``real``: a real process group (``measure.distributed``), where DDP runs
    as users run it, not with the fake process group's steady-state reducer and hook."""
    tp_mesh, dp_mesh, pp_mesh, ep_mesh, experts_dp_mesh = meshes
    if execution.tensor > 1:
        from nnperf.trace.tensor_parallel import apply_tensor_parallel, check_divisible

        check_divisible(workload.model, workload.info.get("config", {}), execution.tensor,
                        execution.sequence_parallel, workload.info.get("seq_len"))
        if apply_tensor_parallel(workload.model, tp_mesh, execution.sequence_parallel,
                                 loss_parallel=execution.splits_logits):
            step_contexts.enter_context(_loss_parallel())
    if execution.expert > 1:
        _apply_expert_parallel(workload.model, execution.expert, ep_mesh)
    if prepare is not None:
        prepare(workload)
    parts = [workload.model]
    if execution.pipeline > 1:
        workload.model = _pipeline_rank(workload, execution, options, pp_mesh)
        parts = list(workload.model.stages)
    if execution.data_parallel == 1 and execution.data != "fsdp":
        return workload
    if execution.replicates_parameters:
        if real:
            from torch.nn.parallel import DistributedDataParallel

            workload.model = DistributedDataParallel(workload.model, bucket_cap_mb=execution.bucket_bytes / 2**20)
        else:
            workload.model = _ddp(workload, execution)
        # ZeRO-1: each rank updates the optimizer state of its share of the parameters and
        # broadcasts them (torch.distributed.optim.ZeroRedundancyOptimizer, made by make_optimizer)
        setattr(workload.model, SHARDS_OPTIMIZER, execution.data == "zero1")
    else:
        for part in parts:
            if execution.expert > 1:
                _shard_experts(part, experts_dp_mesh, execution, options.amp)
            _fully_shard(part, dp_mesh, units(part), execution.reshard_after_forward, options.amp)
            if execution.expert > 1:
                _explicit_prefetch(part, units(part))
    return workload


def _explicit_prefetch(model: nn.Module, blocks: list[str]) -> None:
    """torchtitan's explicit FSDP2 prefetch under expert parallelism (``apply_fsdp``: the
    dispatch's device-to-host read would hold back FSDP's implicit prefetch): each block
    gathers the next block and its experts in forward, the previous ones in backward."""
    from nnperf.zoo.moe import GroupedExperts

    modules = dict(model.named_modules())
    wrapped = [modules[name] for name in blocks]

    def with_experts(block: nn.Module) -> list[nn.Module]:
        return [block] + [m for m in block.modules() if isinstance(m, GroupedExperts)]

    for block, after in itertools.pairwise(wrapped):
        block.set_modules_to_forward_prefetch(with_experts(after))
        after.set_modules_to_backward_prefetch(with_experts(block))


def _pipeline_rank(workload: Workload, execution: Execution, options: TraceOptions, pp_mesh: Any) -> nn.Module:
    """This rank's pipeline chunks and schedule over the pipeline group (trace.pipeline)."""
    from nnperf.trace.loss import loss_for
    from nnperf.trace.options import AMP_DTYPES
    from nnperf.trace.pipeline import PipelineRank, rank_stages, split, stage_shapes

    def autocast() -> Any:
        if not options.amp:
            return contextlib.nullcontext()
        return torch.autocast("cpu", dtype=AMP_DTYPES[options.amp])

    stages = execution.pipeline * (execution.virtual_stages if execution.virtual_stages > 1 else 1)
    chunks = split(workload.model, stages)
    batch = workload.inputs[0].shape[0]
    if batch % execution.grad_accum:
        raise UsageError(f"a batch of {batch} does not split into {execution.grad_accum} micro-batches")
    mine = rank_stages(pp_mesh.get_local_rank(), execution.pipeline, execution.pipeline_schedule or "",
                       execution.virtual_stages)
    # a chunked loss runs the last chunk's output projection (torchtitan's ChunkedLossWrapper on
    # the last stage); on the other ranks no loss runs
    last = stages - 1 in mine
    loss = loss_for(workload.loss_fn or default_loss, options.loss if last else "eager", chunks[-1])
    # the shapes of this rank's chunks need the forward up to its last chunk only
    shapes = stage_shapes(chunks[:max(mine) + 1], tuple(workload.inputs), batch // execution.grad_accum, autocast)
    return PipelineRank([chunks[i] for i in mine], mine, stages, execution.pipeline_schedule or "",
                        execution.grad_accum, tuple(workload.inputs), loss, pp_mesh.get_group(),
                        [shapes[i] for i in mine])


def _loss_parallel() -> Any:
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel()


def _meshes(execution: Execution, device_type: str = "cpu") -> tuple[Any, Any, Any, Any, Any]:
    """The tensor-, data- and pipeline-parallel (sub)meshes, sliced from one device mesh, and
    with expert parallelism the expert group and the data-parallel mesh of the experts' weights
    (torchtitan's ``ep`` and ``dp_shard_mod_ep``). A mesh reads its rank table with real
    tensors: made and sliced before the fake mode starts."""
    from torch.distributed.device_mesh import init_device_mesh

    names, sizes = zip(*execution.mesh_shape(), strict=True)
    mesh = init_device_mesh(device_type, sizes, mesh_dim_names=names)
    expert_mesh = experts_data = None
    if execution.expert > 1:
        mesh["shard_mod_expert", "expert"]._flatten("shard")
        expert_mesh = mesh["expert"]
        experts_data = mesh[("replicate", "shard_mod_expert") if execution.data == "hsdp" else "shard_mod_expert"]
    data = ("replicate", "shard") if execution.data == "hsdp" else ("shard" if execution.expert > 1 else names[1:2])
    with warnings.catch_warnings():
        # torchtitan slices its flattened data mesh ("dp_shard" over dp_shard_mod_ep x ep) the same way
        warnings.filterwarnings("ignore", "Slicing a flattened dim", UserWarning)
        return mesh["tensor"], mesh[data], mesh["pipeline"], expert_mesh, experts_data


def _apply_expert_parallel(model: nn.Module, expert: int, mesh: Any) -> None:
    from nnperf.trace.expert_parallel import apply_expert_parallel, has_experts

    experts = has_experts(model)
    if not experts:
        raise UsageError(f"expert parallelism ({expert}) needs a mixture-of-experts model; this one has no "
                         "experts (zoo: mixtral-8x7b, or llama-7b -O n_experts=N)")
    if experts % expert:
        valid = [d for d in range(1, experts + 1) if experts % d == 0]
        raise UsageError(f"{experts} experts do not divide over expert parallelism {expert}; "
                         f"valid: {', '.join(map(str, valid))}")
    apply_expert_parallel(model, mesh)


def _shard_experts(model: nn.Module, mesh: Any, execution: Execution, amp: str | None) -> None:
    """FSDP2 over each expert group's local weights on the ranks outside the expert group, on
    their hidden dimension where their experts are fewer than those ranks (torchtitan's
    ``apply_fsdp`` with ``dp_mod_ep_mesh``). An expert's gradient sums the tokens of every rank
    of its expert group, so it is divided by all the data-parallel ranks, not only the ones it
    is reduced over (torchtitan's ``set_gradient_divide_factor``)."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard

    from nnperf.zoo.moe import GroupedExperts

    policy = _mixed_precision(amp)
    for module in model.modules():
        if isinstance(module, GroupedExperts):
            local = module.w1.shape[0] // execution.expert
            placement = (lambda p: Shard(1)) if mesh.size() > local else None
            fully_shard(module, mesh=mesh, reshard_after_forward=execution.reshard_after_forward,
                        mp_policy=policy, shard_placement_fn=placement)
            if dist.get_backend() != "gloo":  # gloo has no pre-multiplied sum (ReduceOp.PREMUL_SUM):
                # on CPUs the experts' gradients are averaged over their FSDP group only, EP times
                # the whole layer's; the step's work, bytes and collectives are the same
                module.set_gradient_divide_factor(float(execution.data_parallel))


def _mixed_precision(amp: str | None) -> Any:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from nnperf.trace.options import AMP_DTYPES

    return MixedPrecisionPolicy(param_dtype=AMP_DTYPES[amp], reduce_dtype=torch.float32) if amp else \
        MixedPrecisionPolicy()


def _fully_shard(model: nn.Module, mesh: Any, blocks: list[str], reshard: bool, amp: str | None = None) -> None:
    """FSDP2 per block, then the root. With mixed precision (``--amp``) the parameters are
    gathered in the compute dtype and gradients reduced in fp32 (``MixedPrecisionPolicy``, as
    torchtitan's ``mixed_precision_param`` / ``mixed_precision_reduce`` defaults do)."""
    from torch.distributed.fsdp import fully_shard

    policy = _mixed_precision(amp)
    modules = dict(model.named_modules())
    for name in blocks:
        fully_shard(modules[name], mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
    # torchtitan leaves the root gathered after forward: backward needs it first
    fully_shard(model, mesh=mesh, reshard_after_forward=False if blocks else reshard, mp_policy=policy)


def _ddp(workload: Workload, execution: Execution) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel
    from torch.nn.parallel import distributed as ddp_module

    order = _gradient_ready_order(workload)
    verify = ddp_module._verify_param_shape_across_processes
    ddp_module._verify_param_shape_across_processes = lambda *a, **k: None
    try:
        ddp = DistributedDataParallel(workload.model, bucket_cap_mb=execution.bucket_bytes / 2**20)
    finally:
        ddp_module._verify_param_shape_across_processes = verify
    _steady_state_reducer(ddp, order, execution.bucket_bytes)
    ddp.register_comm_hook(None, _allreduce_hook)
    return ddp


def _gradient_ready_order(workload: Workload) -> list[int]:
    """Indices of the trainable parameters in the order backward finishes their gradients
    (what DDP's reducer records in its first step and rebuilds its buckets by)."""
    params = [p for p in workload.model.parameters() if p.requires_grad]
    index = {id(p): i for i, p in enumerate(params)}
    order: list[int] = []
    handles = [p.register_post_accumulate_grad_hook(lambda p: order.append(index[id(p)])) for p in params]
    try:
        # under the tracer's substitutions (fused attention, native dropout), as the traced step
        # and a checkpointed block's recomputation run
        with GraphLabeler(ModuleStack({})):
            output = workload.model(*workload.inputs)
            (workload.loss_fn or default_loss)(output).backward()
    finally:
        for h in handles:
            h.remove()
        for p in params:
            p.grad = None
    return list(dict.fromkeys(order)) + [i for i in range(len(params)) if i not in set(order)]


def _steady_state_reducer(ddp: Any, order: list[int], bucket_bytes: int) -> None:
    """Replace the first-step reducer (one bucket) by the one DDP rebuilds after step 1:
    buckets filled in gradient-ready order, the first capped at ``dist._DEFAULT_FIRST_BUCKET_BYTES``
    when the cap is DDP's default (as ``_BucketCapacityConfig`` and the C++ rebuild do)."""
    params = [p for p in ddp.module.parameters() if p.requires_grad]
    first = dist._DEFAULT_FIRST_BUCKET_BYTES if bucket_bytes == DDP_BUCKET_BYTES else bucket_bytes
    ordered = [params[i] for i in order]
    limits = [first, bucket_bytes] if first < bucket_bytes else [bucket_bytes]
    buckets, per_bucket = dist._compute_bucket_assignment_by_size(ordered, limits, [False] * len(ordered))
    buckets = [[order[i] for i in bucket] for bucket in buckets]
    reducer = dist.Reducer(
        params, buckets, per_bucket, ddp.process_group, [False] * len(params), bucket_bytes,
        False, False, {}, first, False, False, [], False,
    )
    ddp.reducer = reducer
    ddp.logger = dist.Logger(reducer)
    reducer.set_logger(ddp.logger)


def _allreduce_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's default all-reduce (sum over the group, divided by its size), completed at once."""
    buffer = bucket.buffer()
    buffer.div_(dist.get_world_size())
    dist.all_reduce(buffer)
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(buffer)
    return future


# DDP checks a hook's annotations as objects (this module's are strings: __future__).
_allreduce_hook.__annotations__.update(bucket=dist.GradBucket, return_=None)
_allreduce_hook.__annotations__["return"] = torch.futures.Future[torch.Tensor]
del _allreduce_hook.__annotations__["return_"]


@contextlib.contextmanager
def _quiet_sharding_propagation(memo: dict[Any, Any]) -> Iterator[None]:
    """DTensor learns its outputs' shapes by running the op on placeholder tensors; those
    are not kernels any GPU runs, so they are not recorded. FSDP2 over tensor-parallel
    parameters joins the two meshes (``DeviceMesh._concatenate``), reading the rank table with
    real tensor ops: run outside the fake mode, as in a real process."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    original = ShardingPropagator._propagate_tensor_meta_non_cached
    concatenate = DeviceMesh.__dict__["_concatenate"]

    @functools.wraps(original)
    def quiet(self: Any, *args: Any, **kwargs: Any) -> Any:
        with unrecorded():
            return original(self, *args, **kwargs)

    def real_concatenate(meshes: list[Any]) -> Any:
        with unset_fake_temporarily(), unrecorded():
            return concatenate.__func__(meshes)

    ShardingPropagator._propagate_tensor_meta_non_cached = quiet
    DeviceMesh._concatenate = staticmethod(real_concatenate)
    propagator = _sharding_propagator()
    uncached = propagator.propagate_op_sharding_non_cached

    def memoized(op_schema: Any) -> Any:
        # Under a fake mode DTensor skips its sharding cache (it assumes a compiler traces
        # symbolic shapes); a trace's shapes are concrete, so a decision is reused as a real
        # run's cache reuses it (for this process group only: the cache is per rank)
        try:
            return memo[op_schema]
        except KeyError:
            result = memo[op_schema] = uncached(op_schema)
            return result
        except TypeError:  # an unhashable schema
            return uncached(op_schema)

    propagator.propagate_op_sharding_non_cached = memoized
    try:
        with _follow_fsdp_storage(), fsdp_gathers_outside_selective_checkpointing():
            yield
    finally:
        ShardingPropagator._propagate_tensor_meta_non_cached = original
        DeviceMesh._concatenate = concatenate
        del propagator.propagate_op_sharding_non_cached


@contextlib.contextmanager
def _follow_fsdp_storage() -> Iterator[None]:
    """FSDP2 frees a gathered parameter by resizing its storage to 0 bytes and gathers into it
    again later (``_fsdp_param.free_storage`` / ``alloc_storage``); a storage resize is no op
    the recorder sees, so the recorder is told, and the memory pass sees each gathered copy
    live only between its all-gather and its reshard, as on the GPU."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    from nnperf.trace.recorder import OpRecorder

    def recorder() -> OpRecorder | None:
        return next((m for m in _get_current_dispatch_mode_stack() if isinstance(m, OpRecorder)), None)

    alloc, free = _fsdp_param.alloc_storage, _fsdp_param.free_storage

    def alloc_storage(tensor: torch.Tensor) -> None:
        resized = tensor.untyped_storage().size() != tensor.numel() * tensor.itemsize
        alloc(tensor)
        if resized and (r := recorder()) is not None:
            r.storage_allocated(tensor)

    def free_storage(tensor: torch.Tensor) -> None:
        if tensor.untyped_storage().size() != 0 and (r := recorder()) is not None:
            r.storage_freed(tensor)
        free(tensor)

    _fsdp_param.alloc_storage = _fsdp_param_group.alloc_storage = alloc_storage
    _fsdp_param.free_storage = free_storage
    try:
        yield
    finally:
        _fsdp_param.alloc_storage = _fsdp_param_group.alloc_storage = alloc
        _fsdp_param.free_storage = free


_IN_FSDP_GATHER = [0]


@contextlib.contextmanager
def fsdp_gathers_outside_selective_checkpointing() -> Iterator[None]:
    """FSDP2's all-gather launch and copy-out bypass selective checkpointing's op caching, as
    PyTorch does from pytorch/pytorch#196862 ("[FSDP] Exclude all-gather internals from
    selective checkpointing"): a unit FSDP shards inside a checkpointed block (an MoE layer's
    experts) may be gathered once in forward (prefetched, outside the block) and again inside
    the recomputation, and torch 2.13's selective checkpointing would stop at the unmatched
    ``fsdp.all_gather_copy_in``. Profiler annotations (FSDP's ``record_function`` ranges) are
    passed through too, as in that fix."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group
    from torch.utils import checkpoint

    modes = (checkpoint._CachingTorchDispatchMode, checkpoint._CachedTorchDispatchMode)
    originals = {mode: mode.__dict__["__torch_dispatch__"] for mode in modes}
    gather, copy_out = _fsdp_param_group.foreach_all_gather, _fsdp_param_group.foreach_all_gather_copy_out

    def passing(original: Any) -> Any:
        def dispatch(self: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if _IN_FSDP_GATHER[0] or getattr(func, "namespace", "") == "profiler":  # annotations: the fix's too
                return func(*args, **(kwargs or {}))
            return original(self, func, types, args, kwargs)
        return dispatch

    def bypassing(fn: Any) -> Any:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            _IN_FSDP_GATHER[0] += 1
            try:
                return fn(*args, **kwargs)
            finally:
                _IN_FSDP_GATHER[0] -= 1
        return call

    for mode in modes:
        mode.__torch_dispatch__ = passing(originals[mode])
    _fsdp_param_group.foreach_all_gather = bypassing(gather)
    _fsdp_param_group.foreach_all_gather_copy_out = bypassing(copy_out)
    try:
        yield
    finally:
        for mode in modes:
            mode.__torch_dispatch__ = originals[mode]
        _fsdp_param_group.foreach_all_gather, _fsdp_param_group.foreach_all_gather_copy_out = gather, copy_out


def _collectives(trace: Trace) -> list[Collective]:
    """The trace's collectives with their groups (resolved while the process group lives)."""
    out = []
    for event in trace.events:
        spec = COLLECTIVES.get(event.name)
        if spec is None:
            continue
        ranks, name = _group_of(event)
        if spec[0] == "send_recv":  # (tensors, group, peer's rank in the group, tag): the pair
            me, peer = dist.get_rank(), ranks[event.args[2]]
            ranks = (me, peer) if event.name == "c10d.send" else (peer, me)
        out.append(Collective(event.index, spec[0], collective_bytes(event, spec[1]), len(ranks),
                              ranks, event.phase, event.module, name))
    return out


def _group_of(event: Any) -> tuple[tuple[int, ...], str]:
    """The ranks and name of the process group a collective ran on."""
    for value in list(event.args) + list(event.kwargs.values()):
        group = _as_group(value)
        if group is not None:
            return tuple(dist.get_process_group_ranks(group)), group.group_name
    return tuple(range(dist.get_world_size())), dist.group.WORLD.group_name


def _as_group(value: Any) -> Any:
    if isinstance(value, dist.ProcessGroup):
        return value
    if isinstance(value, torch.ScriptObject):
        try:
            return dist.ProcessGroup.unbox(value)
        except (RuntimeError, TypeError):
            return None
    if isinstance(value, str):  # functional collectives name their group
        try:
            return dist.distributed_c10d._resolve_process_group(value)
        except (RuntimeError, ValueError, KeyError):
            return None
    return None


def sharded_bytes(trace: RankTrace) -> dict[str, int]:
    """Per-rank parameter, gradient and optimizer-state bytes of the traced step."""
    from nnperf.trace.events import KIND_GRAD, KIND_OPT_STATE, KIND_PARAM

    totals = {"parameters": 0, "gradients": 0, "optimizer_state": 0}
    names = {KIND_PARAM: "parameters", KIND_GRAD: "gradients", KIND_OPT_STATE: "optimizer_state"}
    for info in trace.trace.storages.values():
        key = names.get(info.kind)
        if key is not None:
            totals[key] += info.nbytes
    return totals


__all__ = ["Collective", "Execution", "RankTrace", "fake_process_group", "local", "release_session",
           "sharded_bytes", "trace_rank", "wrap_workload"]
