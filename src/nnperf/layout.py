"""A multi-GPU layout as one plain record, and the names of its choices as data.

``Execution`` is the one explicit record of a layout (as Calculon keeps one, as torchtitan's
``ParallelDims`` does): world size, how the data-parallel degree is split into replicas and
shards, the tensor-parallel degree (with or without sequence parallelism), pipeline, context
and expert parallelism, and the loop settings that change the step (micro-batch, accumulation,
activation checkpointing). It validates itself, so every caller (the plan's search, a measured
run, the engines' configs) refuses the same layouts with the same line.

The choices a layout names are records here too, not string literals spread over the code:
each data-parallel engine (``DATA_ENGINES``: what it replicates or shards, how its mesh is
laid out, how a plan describes it), each pipeline schedule (``SCHEDULES``: whether it runs
several chunks per rank, its name in torchtitan), and the activation-checkpointing policies
(``CHECKPOINTS``). Adding a strategy starts here; where it is applied to a workload is
``trace.parallel`` (one module per strategy).

This module imports nothing of nnperf but its errors, so every layer can use it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from nnperf.errors import UsageError


@dataclass(frozen=True)
class DataEngine:
    """A data-parallel engine: what each of its ranks holds and how it communicates."""

    name: str
    #: every rank holds the whole parameters and gradients (DDP, and ZeRO-1 beside it)
    replicates_parameters: bool
    #: each rank keeps the optimizer state of its share only (ZeRO-1)
    shards_optimizer: bool
    #: its device mesh, outermost first: "replicate" (replicas) and/or "shard" (shard group)
    mesh: tuple[str, ...]


#: The data-parallel engines, by the name ``--data`` and the JSON give them.
DATA_ENGINES: dict[str, DataEngine] = {
    "ddp": DataEngine("ddp", replicates_parameters=True, shards_optimizer=False, mesh=("replicate",)),
    # DDP with the optimizer state sharded: Megatron-LM's distributed optimizer (buckets
    # reduce-scattered, each rank's even share updated, the parameters all-gathered)
    "zero1": DataEngine("zero1", replicates_parameters=True, shards_optimizer=True, mesh=("replicate",)),
    "fsdp": DataEngine("fsdp", replicates_parameters=False, shards_optimizer=True, mesh=("shard",)),
    "hsdp": DataEngine("hsdp", replicates_parameters=False, shards_optimizer=True, mesh=("replicate", "shard")),
}
DATA_PARALLEL = tuple(DATA_ENGINES)
#: DDP's defaults (torch.nn.parallel.DistributedDataParallel): 25 MiB buckets, the first 1 MiB.
DDP_BUCKET_BYTES = 25 * 1024 * 1024
#: How routed tokens reach their experts (``Execution.token_dispatcher``).
TOKEN_DISPATCHERS = ("alltoall", "deepep")
#: The frameworks a layout can be planned as (``Execution.framework``): Megatron-LM (and
#: Megatron-DeepSpeed, which runs its layouts), and torch's own pieces as torchtitan composes them.
FRAMEWORKS = ("megatron", "torch")


@dataclass(frozen=True)
class OptimizerStates:
    """What the distributed optimizer (ZeRO-1) keeps for each element of its shares besides the
    model's parameter and gradient: a main copy of the parameter and Adam's two moments, in
    these dtypes (``Execution.optimizer_states``; ``trace.parallel.distributed_optimizer``)."""

    name: str
    #: the main copy's dtype; None: none, the 16-bit share is updated itself
    main: str | None
    moments: str
    #: how Megatron-LM is asked for it ("": its default), or None where it has no such optimizer
    megatron_args: str | None
    source: str


#: ``Execution.optimizer_states``, by name: 12, 8 and 4 bytes per element of a share beside a
#: 16-bit model.
OPTIMIZER_STATES = {states.name: states for states in (
    OptimizerStates("fp32", "fp32", "fp32", "",
                    "Megatron-LM's distributed optimizer (megatron/core/optimizer/distrib_optimizer.py): an fp32 "
                    "main parameter and fp32 moments"),
    OptimizerStates("bf16-moments", "fp32", "bf16",
                    "--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16",
                    "Megatron-Core's precision-aware optimizer, Transformer Engine's FusedAdam with exp_avg_dtype "
                    "and exp_avg_sq_dtype bf16: an fp32 main parameter, bf16 moments"),
    OptimizerStates("bf16", None, "bf16", None,
                    "Apex's DistributedFusedAdam with dtype bf16 beside a bf16 model (NeMo's optim.dtype bf16: "
                    "NeMo sets store_params False where the optimizer's dtype is the model's): bf16 moments, "
                    "no main copy"),
)}


@dataclass(frozen=True)
class Schedule:
    """A pipeline schedule of ``torch.distributed.pipelining``."""

    name: str
    #: runs two or more model chunks per rank (``virtual_stages``), placed in a loop
    multi_chunk: bool
    torchtitan: str  # its name in torchtitan's ``pipeline_parallel_schedule``


SCHEDULES: dict[str, Schedule] = {
    "gpipe": Schedule("gpipe", False, "GPipe"),
    "1f1b": Schedule("1f1b", False, "1F1B"),
    "interleaved-1f1b": Schedule("interleaved-1f1b", True, "Interleaved1F1B"),
    "zero-bubble": Schedule("zero-bubble", True, "InterleavedZeroBubble"),
}
#: The schedules that run several chunks per rank.
MULTI = frozenset(name for name, s in SCHEDULES.items() if s.multi_chunk)

#: Activation checkpointing of every repeated block: "full" recomputes the whole block in
#: backward; the selective policies recompute part of it (search.memory_variants): "selective"
#: nnperf's (weight matmuls and fused attention kept, the rest recomputed), "selective-op"
#: torchtitan's per-op policy (every second matmul of a block recomputed too),
#: "selective-op-recompute-a2a" the same list as torchtitan ran it before it saved the expert
#: all-to-alls (2025; they and their host syncs run again in backward),
#: "selective-attention" Megatron-LM's --recompute-activations (the core attention only).
CHECKPOINTS = ("full", "selective", "selective-op", "selective-op-recompute-a2a", "selective-attention")

#: The plan's selective tier: each layout's engine's own selective recomputation
#: (``Execution.engine_selective``), so the winner is a layout its engine runs. A search level,
#: never an ``Execution.checkpoint``.
ENGINE_SELECTIVE = "selective"

#: What the plan's search tries and what a user may restrict it to (``nnperf plan --data``,
#: ``--checkpoint``, ``--schedule``): the checkpointing levels in the order the search tries
#: them (``CHECKPOINT_LEVELS``; ``SEARCHED_CHECKPOINTS`` by default: none, the engine's
#: selective policy, full), by name ("none" for None); the schedules tried by default; the
#: pipeline degrees of an automatic search; the chunks per rank of an interleaved schedule.
CHECKPOINT_LEVELS = (None, ENGINE_SELECTIVE, "selective-op", "selective-attention", "full")
SEARCHED_CHECKPOINTS = (None, ENGINE_SELECTIVE, "full")
CHECKPOINT_NAMES = {"none": None, ENGINE_SELECTIVE: ENGINE_SELECTIVE, "selective-op": "selective-op",
                    "selective-attention": "selective-attention", "full": "full"}
DEFAULT_SCHEDULES = ("1f1b", "interleaved-1f1b")
PIPELINE_DEGREES = (1, 2, 4, 8, 16)
INTERLEAVE = 2


@dataclass(frozen=True)
class Execution:
    """How a step runs on many GPUs: the layout and the loop settings that change it.

    ``world = replicate * shard * tensor * pipeline * context``; DDP: ``shard = 1``; FSDP
    (full shard): ``replicate = 1``; HSDP: both above 1 (shard inside a node, replicate
    across). ``expert`` divides the data-parallel ranks of expert layers (MoE).
    """

    world: int
    data: str = "ddp"  # one of DATA_ENGINES
    #: FSDP's (HSDP's) shard group; None: what the engine implies (1 for DDP and ZeRO-1, every
    #: data-parallel rank for FSDP), so a layout is written as its source states it; HSDP's is given
    shard: int | None = None
    reshard_after_forward: bool = True  # FSDP2: free gathered parameters after forward
    gpus_per_node: int = 8
    micro_batch: int = 1  # samples per rank per micro-batch
    grad_accum: int = 1  # micro-batches per optimizer step
    checkpoint: str | None = None  # None or one of CHECKPOINTS (per repeated block)
    tensor: int = 1
    sequence_parallel: bool = False
    pipeline: int = 1
    pipeline_schedule: str | None = None  # one of SCHEDULES
    context: int = 1
    expert: int = 1
    #: Megatron-LM's --expert-tensor-parallel-size beside tensor parallelism: 1, each expert
    #: whole on a rank and the expert group folded over the tensor-parallel ranks (Megatron-Core's
    #: MoE parallel folding, as DeepSeek-V3's and Qwen3's recipes run), or ``tensor``, each expert
    #: split as the dense layers are; None: Megatron-Core's default, ``tensor``, folded only where
    #: the data-parallel ranks cannot hold the expert group (``folds_experts``)
    expert_tensor: int | None = None
    #: how routed tokens reach their experts' ranks (one of TOKEN_DISPATCHERS): "alltoall", NCCL's
    #: all-to-all, a copy per expert (Megatron-LM's --moe-token-dispatcher-type alltoall,
    #: torchtitan's); "deepep", DeepEP's kernels, a copy per node (Megatron-LM's flex dispatcher:
    #: ``kernels.expert_dispatch``)
    token_dispatcher: str = "alltoall"
    #: Megatron-LM's --overlap-moe-expert-parallel-comm: each backward runs beside the next
    #: micro-batch's forward, layer by layer, one's expert all-to-alls behind the other's compute
    #: (``search.plan.expert_overlap``), with one more micro-batch's forward before the first
    #: backward of an interleaved pipeline
    expert_overlap: bool = False
    #: the dtypes of ZeRO-1's main parameters and Adam moments (one of OPTIMIZER_STATES): "fp32",
    #: Megatron-LM's default; "bf16-moments", its precision-aware optimizer with bf16 moments
    #: (DeepSeek-V3's recipe, the Megatron MoE recipes' FP8 runs); "bf16", Apex's
    #: DistributedFusedAdam in bf16 beside a bf16 model (NeMo's optim.dtype bf16: Nemotron-4 340B)
    optimizer_states: str = "fp32"
    #: ZeRO-1's gradients kept and reduce-scattered in fp32 beside a bf16 or fp16 model: Megatron-LM's
    #: main gradients (``--accumulate-allreduce-grads-in-fp32``, its default for --bf16 unless
    #: --grad-reduce-in-bf16; NeMo's and Megatron-Bridge's bf16 mixed precision,
    #: ``grad_reduce_in_fp32=True``; DeepSpeed's ``grad_accum_dtype`` fp32); False: the model's own
    #: dtype (``trace.parallel.distributed_optimizer``)
    grad_reduce_in_fp32: bool = False
    bucket_bytes: int = DDP_BUCKET_BYTES
    virtual_stages: int = 1  # model chunks per pipeline rank (interleaved schedules)
    loss_parallel: bool = True  # TP: logits split over the vocabulary for the loss
    #: an uneven pipeline: the blocks of its first and last stage, over each one's chunks (None:
    #: as the others; both None: an even split), the stages between splitting the rest evenly
    #: (``chunk_layers``, ``split_layers``: Megatron-LM's --decoder-first/last-pipeline-num-layers)
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None
    #: Megatron-LM's --tp-comm-overlap: Transformer Engine's userbuffers run each sequence-parallel
    #: all-gather and reduce-scatter of a block in chunks with the GEMM it feeds or follows
    #: (``passes.comm_timeline``), instead of before or after it
    tp_comm_overlap: bool = False
    #: torch's async tensor parallelism (torchtitan's enable_async_tensor_parallel, under
    #: torch.compile): Inductor's micro-pipeline pass runs each compiled block's sequence-parallel
    #: all-gather and reduce-scatter in chunks with the GEMMs it feeds or follows
    #: (``search.plan.rank.async_tensor_parallel_chunks``)
    async_tp: bool = False
    #: Megatron-LM's --cross-entropy-loss-fusion: Megatron-Core's fused cross entropy, its pieces
    #: compiled one by one (``trace.parallel.fused_vocab_parallel_loss``)
    loss_fusion: bool = False
    #: the framework that runs the layout (one of FRAMEWORKS): "megatron", Megatron-LM's tensor
    #: parallelism, loss and pipeline schedules; "torch", DTensor's, torch's loss and
    #: ``torch.distributed.pipelining``'s. Both run tensor, pipeline and context parallelism
    #: with data parallelism over one rank, so such a layout is planned as the one asked for;
    #: None: the one the layout implies (``megatron_layout``)
    framework: str | None = None

    def __post_init__(self) -> None:
        engine = DATA_ENGINES.get(self.data)
        if self.shard is None and engine is not None and len(engine.mesh) == 1:
            # one mesh dimension implies the group: DDP and ZeRO-1 shard nothing, FSDP over
            # every data-parallel rank; HSDP's shard group, beside its replicas, is a choice
            every_rank = max(self.world // max(self.model_parallel, 1), 1)
            object.__setattr__(self, "shard", 1 if engine.replicates_parameters else every_rank)
        # a pipeline given no schedule runs the engines' default: 1F1B (Megatron-LM's, and
        # torchtitan's pipeline_parallel_schedule), interleaved where it has virtual stages
        if self.pipeline > 1 and self.pipeline_schedule is None:
            object.__setattr__(self, "pipeline_schedule", "interleaved-1f1b" if self.virtual_stages > 1 else "1f1b")
        if self.checkpoint == "none":  # as --checkpoint spells it: no checkpointing is None
            object.__setattr__(self, "checkpoint", None)

    @property
    def engine(self) -> DataEngine:
        """The data-parallel engine's record (``validate`` refuses an unknown name)."""
        return DATA_ENGINES[self.data]

    @property
    def replicate(self) -> int:
        return self.world // (self.shard * self.tensor * self.pipeline * self.context)

    @property
    def replicates_parameters(self) -> bool:
        """Every data-parallel rank holds the whole parameters and gradients (DDP, and DDP with
        the optimizer state sharded: ZeRO-1)."""
        return self.engine.replicates_parameters

    @property
    def shards_optimizer_only(self) -> bool:
        """ZeRO-1: whole parameters and gradients on every rank, the optimizer state sharded."""
        return self.engine.replicates_parameters and self.engine.shards_optimizer

    @property
    def megatron_only(self) -> bool:
        """A layout only Megatron-LM runs: ZeRO-1 (torchtitan has none; over one data-parallel
        rank too, as NeMo's and Megatron-Bridge's recipes keep --use-distributed-optimizer at any
        degree), or DDP beside tensor, pipeline or context parallelism (torchtitan runs DDP alone)."""
        return self.shards_optimizer_only or (
            self.replicates_parameters and self.data_parallel > 1 and self.model_parallel > 1)

    @property
    def runs_short_1f1b(self) -> bool:
        """Megatron-LM's (and DeepSpeed's) 1F1B, beside their data parallelism, runs fewer
        micro-batches than stages too: its warm-up is ``min(stages - rank - 1, micro-batches)``
        forwards (megatron/core/pipeline_parallel/schedules.py,
        ``forward_backward_pipelining_without_interleaving``), so every forward runs before any
        backward (the SC21 paper's schedule figures run 1 to 8 micro-batches on 16-32 stages)."""
        return self.pipeline_schedule == "1f1b" and self.replicates_parameters

    @property
    def blocking_pipeline_sends(self) -> bool:
        """Whether each pipeline stage waits for its sends to arrive before its next action
        (``passes.pipeline_timeline``): Megatron-LM's non-interleaved 1F1B does (its p2p calls
        ``_communicate`` with ``wait_on_reqs=True``), as DeepSpeed's pipeline engine does, and
        Megatron-LM runs this layout (``megatron_layout``); torch's schedules (torchtitan's) and
        Megatron-LM's interleaved one (``--overlap-p2p-communication``, on by default) run them
        beside the next action."""
        return self.pipeline > 1 and self.pipeline_schedule == "1f1b" and self.megatron_layout

    @property
    def engine_selective(self) -> str:
        """The selective recomputation this layout's engine has: Megatron-LM's of the core
        attention (``--recompute-activations``) where only Megatron-LM runs the layout,
        torchtitan's per-op policy elsewhere."""
        return "selective-attention" if self.megatron_only or self.framework == "megatron" else "selective-op"

    def with_checkpoint(self, level: str | None) -> Execution:
        """This layout at a search level (``CHECKPOINT_LEVELS``): ``ENGINE_SELECTIVE`` is the
        engine's own selective policy; fully recomputed, without the expert overlap, which
        Megatron-Core refuses beside it."""
        leveled = replace(self, checkpoint=self.engine_selective if level == ENGINE_SELECTIVE else level)
        if leveled.expert_overlap and leveled.expert_overlap_refusal():  # full recomputation: Megatron-Core refuses
            return replace(leveled, expert_overlap=False)
        return leveled

    @property
    def megatron_settings(self) -> bool:
        """One of Megatron-LM's own settings is asked for, which torchtitan has not: its
        --tp-comm-overlap, its fused cross entropy, or its selective recomputation of the core
        attention alone."""
        return (self.tp_comm_overlap or self.loss_fusion or self.expert_overlap
                or self.checkpoint == "selective-attention")

    @property
    def megatron_layout(self) -> bool:
        """Megatron-LM runs this layout: the framework asked for, else one only it runs
        (``megatron_only``), or its data parallelism (DDP or ZeRO-1, over any number of ranks)
        with one of its own settings."""
        if self.framework is not None:
            return self.framework == "megatron"
        return self.megatron_only or (self.replicates_parameters and self.megatron_settings)

    @property
    def megatron_tensor_parallel(self) -> bool:
        """Megatron-LM's layout with tensor parallelism. Its cross entropy and its embedding are
        Megatron-Core's over the vocabulary slices (``trace.parallel.vocab_parallel_loss``,
        ``trace.parallel.vocab_parallel_embedding``)."""
        return self.tensor > 1 and self.megatron_layout

    @property
    def megatron_sequence_parallel(self) -> bool:
        """Megatron-LM's layout with sequence parallelism (``megatron_tensor_parallel``). Its
        linear layers reduce-scatter an input gradient while the weight gradient's GEMM runs
        (``search.plan.rank``)."""
        return self.sequence_parallel and self.megatron_tensor_parallel

    @property
    def keeps_sequence_shards(self) -> bool:
        """Megatron-LM's layout (``megatron_sequence_parallel``): the column-parallel linears save
        their sequence shard for backward and gather it again there, unless the blocks are
        checkpointed beyond Megatron-LM's core attention (``trace.parallel.sequence_shards``)."""
        return self.megatron_sequence_parallel and self.checkpoint in (None, "selective-attention")

    @property
    def data_parallel(self) -> int:
        """Ranks that each see a different slice of the batch."""
        return self.replicate * self.shard

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.grad_accum * self.data_parallel

    @property
    def applies_data_engine(self) -> bool:
        """Whether the data-parallel engine wraps the model: over more than one rank, or FSDP2
        alone (its mixed precision and per-block units apply on one rank too)."""
        return self.data_parallel > 1 or self.data == "fsdp"

    @property
    def splits_logits(self) -> bool:
        """Loss parallelism: with tensor parallelism the logits stay split over the vocabulary for
        the loss, on a pipeline's last stage too (torchtitan's ``loss_parallel_enabled`` is
        ``tp > 1`` whatever the pipeline; Megatron-LM's cross entropy is always vocabulary-parallel)."""
        return self.tensor > 1 and self.loss_parallel

    @property
    def model_parallel(self) -> int:
        """Ranks that hold different parts of one model replica (tensor x pipeline x context)."""
        return self.tensor * self.pipeline * self.context

    @property
    def chunks_per_rank(self) -> int:
        """Model chunks each pipeline rank holds (1 without a multi-chunk schedule)."""
        schedule = SCHEDULES.get(self.pipeline_schedule or "")
        return self.virtual_stages if schedule is not None and schedule.multi_chunk else 1

    @property
    def chunks(self) -> int:
        """Model chunks of the whole pipeline (1 without one)."""
        return self.pipeline * self.chunks_per_rank

    @property
    def uneven(self) -> bool:
        """The pipeline's first or last stage is shortened (``first_stage_layers``...)."""
        return self.first_stage_layers is not None or self.last_stage_layers is not None

    def chunk_layers(self, layers: int) -> tuple[int, ...]:
        """The blocks of each model chunk, in stage order (``split_layers``): the one place a
        pipeline's split is decided, so no caller can drop or invent a block."""
        if self.pipeline == 1:
            return (layers,)
        return split_layers(layers, self.pipeline, self.chunks_per_rank, self.first_stage_layers,
                            self.last_stage_layers)

    def validate(self) -> None:
        if self.checkpoint is not None and self.checkpoint not in CHECKPOINTS:
            raise UsageError(f"unknown activation checkpointing {self.checkpoint!r}; valid: none, "
                             f"{', '.join(CHECKPOINTS)}")
        if self.data not in DATA_ENGINES:
            raise UsageError(f"unknown data parallelism '{self.data}'; valid: {', '.join(DATA_ENGINES)}")
        if self.framework is not None:
            self._validate_framework()
        if self.shard is None:
            raise UsageError("hsdp shards inside a group and replicates across groups: give its shard group "
                             "(shard, 1 < shard < the data-parallel ranks)")
        if self.expert_tensor is not None and self.expert_tensor not in (1, self.tensor):
            raise UsageError(f"expert tensor parallelism {self.expert_tensor} is modelled as Megatron-Core runs it: "
                             "each expert whole on a rank (1) or split as the dense layers are (the tensor "
                             f"degree, {self.tensor}); valid: " + ("1" if self.tensor == 1 else f"1, {self.tensor}"))
        if self.expert_tensor == 1 and self.tensor > 1 and self.expert == 1:
            raise UsageError("expert tensor parallelism 1 beside tensor parallelism folds the expert group over the "
                             "tensor-parallel ranks: it needs expert parallelism (expert > 1)")
        if self.token_dispatcher not in TOKEN_DISPATCHERS:
            raise UsageError(f"unknown token dispatcher {self.token_dispatcher!r}; valid: {', '.join(TOKEN_DISPATCHERS)}")
        if self.token_dispatcher != "alltoall" and (self.expert == 1 or not self.replicates_parameters):
            raise UsageError(f"the {self.token_dispatcher} token dispatcher is Megatron-LM's flex dispatcher: it needs "
                             "expert parallelism (expert > 1) beside ddp or zero1")
        if self.expert_overlap and (refusal := self.expert_overlap_refusal()):
            raise UsageError(refusal)
        if self.optimizer_states not in OPTIMIZER_STATES:
            raise UsageError(f"unknown optimizer states {self.optimizer_states!r}; valid: {', '.join(OPTIMIZER_STATES)}")
        if self.optimizer_states != "fp32" and not self.shards_optimizer_only:
            raise UsageError(f"optimizer states {self.optimizer_states} are a distributed optimizer's: they need "
                             f"zero1 ({self.data} runs PyTorch's optimizer on the parameters as they are)")
        if self.grad_reduce_in_fp32 and not self.shards_optimizer_only:
            raise UsageError("grad_reduce_in_fp32 keeps Megatron-LM's distributed optimizer's main gradients in fp32: "
                             f"it needs zero1 ({self.data} reduces the gradients in the model's dtype)")
        if self.grad_reduce_in_fp32 and OPTIMIZER_STATES[self.optimizer_states].main is None:
            raise UsageError(f"grad_reduce_in_fp32 hands fp32 gradients to fp32 main parameters; optimizer states "
                             f"{self.optimizer_states} keep none: valid: "
                             + ", ".join(n for n, s in OPTIMIZER_STATES.items() if s.main is not None))
        if self.expert != 1:
            self._validate_expert()
        if self.pipeline > 1:
            schedule = SCHEDULES.get(self.pipeline_schedule or "")
            if schedule is None:
                raise UsageError(f"unknown pipeline schedule {self.pipeline_schedule!r}; valid: {', '.join(SCHEDULES)}")
            if self.virtual_stages < 1 or (self.virtual_stages > 1) != schedule.multi_chunk:
                raise UsageError(f"{schedule.name} runs {'2 or more' if schedule.multi_chunk else '1'}"
                                 " model chunks per rank (virtual_stages)")
            if schedule.name != "gpipe" and self.grad_accum < self.pipeline and not self.runs_short_1f1b:
                raise UsageError(f"{schedule.name} needs at least as many micro-batches as stages: "
                                 f"{self.grad_accum} < {self.pipeline}")
            if schedule.multi_chunk and not _whole_rounds(self.grad_accum, self.pipeline):
                rounds = self.grad_accum // self.pipeline
                near = [m for m in range(self.grad_accum - self.pipeline, self.grad_accum + self.pipeline + 1)
                        if m >= self.pipeline and _whole_rounds(m, self.pipeline)]
                raise UsageError(f"{schedule.name} runs micro-batches in rounds of at least one a stage: "
                                 f"{self.grad_accum} micro-batches over {self.pipeline} stages do not split into "
                                 f"{rounds} equal rounds; valid near it: {', '.join(map(str, near))} (a multiple "
                                 f"of {self.pipeline}, as Megatron-LM's interleaved schedule runs, always is)")
        if self.uneven and self.pipeline == 1:
            raise UsageError("first_stage_layers and last_stage_layers shorten pipeline stages: they need pipeline > 1")
        if self.sequence_parallel and self.tensor < 2:
            raise UsageError("sequence parallelism splits what tensor parallelism replicates: it needs tensor > 1")
        if self.tp_comm_overlap and not (self.sequence_parallel and self.replicates_parameters):
            raise UsageError("tp_comm_overlap is Megatron-LM's --tp-comm-overlap: it needs tensor > 1 with "
                             "sequence parallelism and Megatron-LM's data parallelism (ddp or zero1)")
        if self.async_tp and not self.sequence_parallel:
            raise UsageError("async_tp is torch's async tensor parallelism (torchtitan's "
                             "enable_async_tensor_parallel): it needs tensor > 1 with sequence parallelism")
        if self.async_tp and self.framework is None and self.megatron_layout:
            raise UsageError("async_tp is torch's async tensor parallelism (torchtitan's), and this layout is one "
                             f"only Megatron-LM runs ({self.describe()}); valid: async_tp beside fsdp or hsdp or "
                             "with tensor parallelism alone, or Megatron-LM's own overlap, tp_comm_overlap, instead")
        if self.loss_fusion and not self.replicates_parameters:
            raise UsageError("loss_fusion is Megatron-LM's --cross-entropy-loss-fusion: it needs Megatron-LM's "
                             "data parallelism (ddp or zero1)")
        if self.tensor < 1 or self.world < 1 or self.world % self.model_parallel:
            raise UsageError(f"{self.world} GPUs are not a multiple of tensor x pipeline x context = "
                             f"{self.model_parallel}")
        data_parallel = self.world // self.model_parallel
        if self.shard < 1 or data_parallel % self.shard:
            raise UsageError(f"the shard group ({self.shard}) does not divide the {data_parallel} "
                             "data-parallel ranks")
        if self.replicates_parameters and self.shard != 1:
            raise UsageError(f"{self.data} does not shard parameters: shard must be 1")
        if self.replicates_parameters and data_parallel > 1 and self.pipeline_schedule == "zero-bubble":
            raise UsageError(f"{self.data} with a zero-bubble schedule is not modelled (DDP's reducer and a split "
                             "backward); use 1f1b or interleaved-1f1b, as Megatron-LM runs them, or fsdp")
        if self.data == "fsdp" and self.shard != data_parallel:
            raise UsageError(f"fsdp shards over every data-parallel rank: shard must be {data_parallel}")
        if self.data == "hsdp" and not 1 < self.shard < data_parallel:
            raise UsageError("hsdp shards inside a group and replicates across groups: "
                             f"1 < shard < {data_parallel}")

    def _validate_framework(self) -> None:
        """The framework asked for runs the layout and its settings."""
        if self.framework not in FRAMEWORKS:
            raise UsageError(f"unknown framework {self.framework!r}; valid: {', '.join(FRAMEWORKS)}")
        why = self.refusal_by(self.framework)
        if why is not None:
            raise UsageError(why)

    def refusal_by(self, framework: str) -> str | None:
        """Why ``framework`` (one of FRAMEWORKS) does not run this layout, or None where it does:
        Megatron-LM's data parallelism is DDP or ZeRO-1; torch has no ZeRO-1, no DDP beside
        tensor, pipeline or context parallelism, no expert group carved out of DDP's replicas
        and none of Megatron-LM's own settings."""
        if framework == "megatron":
            if self.async_tp:
                return ("framework megatron: async tensor parallelism (async_tp) is torch's, as torchtitan runs it "
                        "beside FSDP; valid: framework torch, or drop async_tp (Megatron-LM's own is "
                        "--tp-comm-overlap, Transformer Engine's userbuffers)")
            if self.replicates_parameters:
                return None
            return (f"framework megatron: Megatron-LM's data parallelism is ddp or zero1, not {self.data} "
                    "(FSDP2 is torch's: framework torch)")
        megatron_own = (
            (self.shards_optimizer_only, "zero1 (torchtitan has no ZeRO-1)"),
            (self.megatron_only, "ddp beside tensor, pipeline or context parallelism (torchtitan runs DDP alone)"),
            (self.tp_comm_overlap, "--tp-comm-overlap"),
            (self.loss_fusion, "fused cross entropy (loss_fusion)"),
            (self.checkpoint == "selective-attention", "attention-only recomputation (selective-attention)"),
            (self.token_dispatcher != "alltoall", f"{self.token_dispatcher} token dispatcher"),
            (self.expert_overlap, "expert all-to-alls overlapped across micro-batches (expert_overlap)"),
            (self.expert > 1 and self.replicates_parameters,
             "expert group carved out of DDP's replicas (torchtitan carves it out of FSDP's shard group)"))
        why = next((what for asked, what in megatron_own if asked), None)
        if why is None:
            return None
        return f"framework torch: the layout asks for Megatron-LM's {why}; valid: framework megatron, or drop it"

    def expert_overlap_refusal(self) -> str | None:
        """Why this layout cannot run Megatron-Core's --overlap-moe-expert-parallel-comm (None: it
        can), the one rule the record's validation and the search's flags share: Megatron-Core's
        checks (TransformerConfig's ``__post_init__``: expert parallelism, virtual pipeline stages
        where there is a pipeline, no full recomputation) and Megatron-LM's data parallelism,
        which runs it."""
        if self.expert < 2 or not self.replicates_parameters:
            return ("expert_overlap is Megatron-LM's --overlap-moe-expert-parallel-comm: it needs expert "
                    "parallelism (expert > 1) beside ddp or zero1")
        if self.pipeline > 1 and self.pipeline_schedule != "interleaved-1f1b":
            return (f"expert_overlap with a pipeline needs virtual stages (Megatron-Core's check): "
                    f"{self.pipeline_schedule} is not interleaved; valid: interleaved-1f1b with "
                    "virtual_stages 2 or more, or pipeline 1")
        if self.checkpoint == "full":
            return ("expert_overlap runs without full recomputation (Megatron-Core's check); valid "
                    "checkpoints: " + ", ".join(c for c in ("none", *CHECKPOINTS) if c != "full"))
        return None

    def _validate_expert(self) -> None:
        """Expert parallelism carves the expert group out of the data-parallel ranks: out of
        FSDP's shard group as torchtitan does (``dp_shard_in_ep``), the experts' weights sharded
        over the rest of it; out of DDP's (ZeRO-1's) replicas as Megatron-LM does
        (``--expert-model-parallel-size``), the experts' gradients reduced over the rest of them
        (its expert-data-parallel group), beside tensor parallelism too (the experts split over
        the tensor-parallel group: ``trace.parallel.expert_tensor``)."""
        if self.expert < 1:
            raise UsageError(f"expert parallelism must be 1 or more, got {self.expert}")
        if self.context > 1:
            raise UsageError("expert parallelism is modelled with data, tensor and pipeline parallelism; "
                             "with context parallelism it is not")
        if not self.carries_split_experts:
            raise UsageError("expert parallelism with tensor parallelism is modelled as Megatron-LM runs it, "
                             f"with ddp or zero1 ({self.data}: torchtitan's expert tensor parallelism is not)")
        group, what = ((self.replicate, "data-parallel ranks") if self.replicates_parameters
                       else (self.shard, "shard group"))
        if self.expert_tensor == 1 and self.tensor > 1 and not self.folds_experts:
            valid = [self.tensor * d for d in range(1, group + 1) if group % d == 0]
            raise UsageError(f"expert parallelism {self.expert} with each expert whole on a rank (expert tensor "
                             f"parallelism 1) folds over the {self.tensor} tensor-parallel ranks: it must be a "
                             f"multiple of {self.tensor} whose quotient divides the {group} {what}; valid: "
                             f"{', '.join(map(str, valid))}")
        if group % self.expert and not self.folds_experts:
            divisors = [d for d in range(1, group + 1) if group % d == 0]
            raise UsageError(f"expert parallelism {self.expert} does not divide the {what} of {group} "
                             f"ranks; valid: {', '.join(map(str, divisors))}")

    @property
    def carries_split_experts(self) -> bool:
        """A mixture of experts can run beside this layout's tensor parallelism: it has none, or
        Megatron-LM's data parallelism (DDP, ZeRO-1) runs it, splitting the experts as
        Megatron-Core does (``trace.parallel.expert_tensor``; torchtitan's expert tensor
        parallelism, beside FSDP, is not modelled)."""
        return self.tensor == 1 or self.replicates_parameters

    @property
    def folds_experts(self) -> bool:
        """Megatron-Core's MoE parallel folding: the expert group spans the tensor-parallel ranks
        too (expert tensor parallelism 1: each expert whole on one rank; Qwen3 235B's EP 32 over
        TP 2 x DP 16). Where ``expert_tensor`` asks for it, or, by default, where the expert degree
        does not divide the data-parallel ranks: elsewhere Megatron-Core's default, the experts
        split as the dense layers are, is what runs (``trace.parallel.expert_tensor``)."""
        if not (self.tensor > 1 and self.expert > 1 and self.replicates_parameters):
            return False
        if self.expert_tensor == self.tensor or (self.expert_tensor is None and self.replicate % self.expert == 0):
            return False
        return self.expert % self.tensor == 0 and self.replicate % (self.expert // self.tensor) == 0

    @property
    def expert_carved_from(self) -> str:
        """The mesh dimension the expert group is carved out of: DDP's and ZeRO-1's replicas
        (Megatron-LM), FSDP's and HSDP's shard group (torchtitan)."""
        return "replicate" if self.replicates_parameters else "shard"

    def describe(self) -> str:
        parts = {"ddp": [f"DDP x{self.replicate}"] if self.replicate > 1 else [],
                 "zero1": [(f"DDP x{self.replicate} + ZeRO-1 (optimizer state sharded" if self.replicate > 1
                            else "ZeRO-1 on 1 data-parallel rank (optimizer state whole")
                           + ("" if self.optimizer_states == "fp32" else f", {self.optimizer_states}")
                           + (", fp32 gradients" if self.grad_reduce_in_fp32 else "") + ")"],
                 "fsdp": [f"FSDP2 full shard x{self.shard}"],
                 "hsdp": [f"HSDP {self.replicate} replicas x {self.shard} shards"]}[self.data]
        if self.tensor > 1:
            parts.append(f"TP x{self.tensor}" + (" + SP" if self.sequence_parallel else "")
                         + (" (comm overlapped)" if self.tp_comm_overlap else "")
                         + (" (async TP)" if self.async_tp else ""))
        if self.pipeline > 1:
            chunks = f", {self.virtual_stages} chunks/rank" if self.virtual_stages > 1 else ""
            parts.append(f"PP x{self.pipeline} {self.pipeline_schedule}{chunks}")
        if self.context > 1:
            parts.append(f"CP x{self.context}")
        if self.expert > 1:
            how = [*(["experts whole, folded over TP"] if self.folds_experts else []),
                   *(["DeepEP"] if self.token_dispatcher == "deepep" else []),
                   *(["all-to-alls overlapped"] if self.expert_overlap else [])]
            parts.append(f"EP x{self.expert}" + (f" ({'; '.join(how)})" if how else ""))
        if not parts:
            parts.append("1 GPU")
        if not self.replicates_parameters and not self.reshard_after_forward:
            parts.append("no reshard after forward")
        if self.checkpoint:
            parts.append(f"{self.checkpoint} checkpointing")
        if self.loss_fusion:
            parts.append("fused cross entropy")
        parts.append(f"micro-batch {self.micro_batch}")
        if self.grad_accum > 1:
            parts.append(f"{'micro-batches' if self.pipeline > 1 else 'accumulation'} x{self.grad_accum}")
        framework = {None: "", "megatron": "Megatron-LM: ", "torch": "torch: "}[self.framework]
        return framework + ", ".join(parts)

    @property
    def expert_split(self) -> int | None:
        """The ranks each expert is split over, where the layout has expert parallelism: 1 where
        the expert group folds over the tensor-parallel ranks (each expert whole), else the tensor
        degree (Megatron-Core's default split); None without expert parallelism."""
        if self.expert == 1:
            return None
        return 1 if self.folds_experts else self.tensor

    def to_json(self) -> dict[str, Any]:
        # the expert split as it runs, not None for "the default" (which folds or not by degrees)
        split = self.expert_tensor if self.expert == 1 else self.expert_split
        return {**asdict(self), "expert_tensor": split, "replicate": self.replicate,
                "data_parallel": self.data_parallel, "global_batch": self.global_batch}

    def mesh_shape(self) -> list[tuple[str, int]]:
        """The device mesh, outermost first (torchtitan's order: data, then tensor innermost so
        a tensor-parallel group is consecutive ranks, inside a node)."""
        sizes = {"replicate": self.replicate, "shard": self.shard}
        dims: list[tuple[str, int]] = []
        # folded, the expert group is the data-parallel part of it beside the tensor-parallel ranks
        carved = self.expert // self.tensor if self.folds_experts else self.expert
        for name in self.engine.mesh:
            if name == self.expert_carved_from and self.expert > 1:
                dims += [(f"{name}_mod_expert", sizes[name] // carved), ("expert", carved)]
            else:
                dims.append((name, sizes[name]))
        return [("pipeline", self.pipeline), *dims, ("tensor", self.tensor)]


def _whole_rounds(micro: int, pipeline: int) -> bool:
    """torch's interleaved schedules (``ScheduleInterleaved1F1B``, ``ScheduleInterleavedZeroBubble``)
    run ``micro // pipeline`` rounds of equally many micro-batches and refuse a count that does
    not split so: the schedules the plan replays are theirs (``schedule_order``), which, given
    such a count, never finish (every rank waiting on another)."""
    return micro % max(1, micro // pipeline) == 0


def split_layers(layers: int, pipeline: int, virtual: int = 1, first: int | None = None,
                 last: int | None = None, *, gpus: int | None = None, where: str | None = None) -> tuple[int, ...]:
    """The blocks of each of the ``pipeline x virtual`` model chunks, in model order (chunk ``c``
    on pipeline rank ``c mod pipeline``, the loop placement of every schedule here): evenly, or
    with the first and last pipeline *stage* (rank) holding ``first`` and ``last`` blocks over
    their ``virtual`` chunks and the stages between splitting the rest evenly, every chunk of
    theirs alike: Megatron-LM's ``--decoder-first/last-pipeline-num-layers``, as Llama 3 405B's
    126 layers over 16 stages, one fewer on the first and last (7, 8 x 14, 7). An end stage's
    blocks split over its chunks evenly where ``virtual`` divides them (Megatron-LM requires
    that of its flags); otherwise the chunk that also holds the embedding (rank 0's first) or
    the head (the last rank's last) is the shorter, which is what shortening those stages is
    for, down to no block at all: Llama 3 405B ran 8 chunks of one block a rank, "the first
    model chunk on the first stage has only the embedding, and the last model chunk on the last
    stage has only output projection and loss calculation" (Llama 3 paper, section 3.3.2), so 0
    + 1 x 7 blocks on rank 0 and 1 x 7 + 0 on rank 15 (Megatron-Core's
    ``--pipeline-model-parallel-layout`` expresses both: ``E|(t|)*126,L``). Every other chunk
    holds a block or more. A split that cannot hold the layers is one line naming valid ones
    (pipeline degrees that divide ``gpus``, where given: the GPUs the other degrees leave the
    pipeline, which ``where`` describes, "on 8 GPUs" unless given)."""
    chunks = pipeline * virtual
    what = f"{pipeline} pipeline stages" + (f" x {virtual} virtual stages" if virtual > 1 else "")
    if first is None and last is None:
        if layers % chunks == 0 and layers >= chunks:
            return (layers // chunks,) * chunks
        if virtual > 1 and layers % pipeline == 0:
            per_stage = layers // pipeline
            valid = [v for v in range(2, per_stage + 1) if per_stage % v == 0]
            raise UsageError(f"{virtual} virtual stages do not divide the {per_stage} layers per pipeline stage "
                             f"({layers} layers over {pipeline} stages); valid: "
                             f"{', '.join(map(str, valid)) or 'none (use a 1-chunk schedule)'}")
        valid = [d for d in range(1, layers + 1) if layers % d == 0 and d % virtual == 0
                 and (gpus is None or gpus % (d // virtual) == 0)]
        below = max((d // virtual for d in valid if d < chunks), default=None)
        above = min((d // virtual for d in valid if d > chunks), default=None)
        nearest = " or ".join(str(d) for d in (below, above) if d is not None)
        on = f" {where or f'on {gpus} GPUs'}" if gpus else ""
        examples = _uneven_examples(layers, pipeline, virtual)
        shorten = (f"; or shorten the first and last stages (--first-stage-layers, --last-stage-layers: "
                   f"{examples})") if examples else ""
        raise UsageError(f"{layers} layers do not split evenly into {what}; nearest valid pipeline degrees{on}: "
                         f"{nearest or 'none'}{shorten}")
    if pipeline == 1:
        raise UsageError("first and last stage layers need two or more pipeline stages")
    fitted = _end_stages(layers, pipeline, virtual, first, last)
    if fitted is None:
        asked = ", ".join(f"{n} stage layers {v}" for n, v in (("first", first), ("last", last)) if v is not None)
        holding = [v for v in range(1, layers + 1)
                   if v != virtual and _end_stages(layers, pipeline, v, first, last) is not None]
        interleaved = [v for v in holding if v > 1]
        keep = [f"--vpp {', '.join(map(str, interleaved))}"] * bool(interleaved) + ["--schedule 1f1b"] * (1 in holding)
        other = f"; or keep them with {' or '.join(keep)}" if keep else ""
        raise UsageError(f"an uneven split with {asked} cannot hold {layers} layers in {what} (the stages "
                         f"between must split the rest evenly, each chunk at least 1 block, but the embedding's "
                         f"and the head's, which may hold none); valid: "
                         f"{_uneven_examples(layers, pipeline, virtual) or 'none'}{other}")
    f, l_, middle = fitted
    firsts, lasts = _end_stage(f, virtual, short_first=True), _end_stage(l_, virtual, short_first=False)
    return tuple(firsts[c // pipeline] if c % pipeline == 0 else lasts[c // pipeline]
                 if c % pipeline == pipeline - 1 else middle or 0 for c in range(chunks))


def _end_stage(blocks: int, virtual: int, short_first: bool) -> list[int]:
    """An end stage's ``blocks`` over its ``virtual`` chunks, evenly where they divide; else the
    shorter chunks first (the first stage's: its first chunk holds the embedding) or last (the
    head's); ``virtual - 1`` blocks leave that chunk the embedding or the head alone."""
    base, extra = divmod(blocks, virtual)
    long = range(virtual - extra, virtual) if short_first else range(extra)
    return [base + (k in long) for k in range(virtual)]


def _end_stages(layers: int, pipeline: int, virtual: int, first: int | None,
                last: int | None) -> tuple[int, int, int | None] | None:
    """The first and last stages' blocks and each chunk's between them (None with two stages)
    of ``split_layers``'s uneven split, the one not given derived; None where it cannot hold."""
    f, l_ = first, last
    if f is None or l_ is None:  # one given: the other as the stages between
        given = f if f is not None else l_
        assert given is not None
        rest, between = layers - given, (pipeline - 1) * virtual
        if pipeline == 2:  # the other end stage holds the rest
            other = rest if rest > 0 else None
        else:
            other = rest // between * virtual if rest > 0 and rest % between == 0 else None
        f, l_ = (f, other) if f is not None else (other, l_)
    # every chunk a block, but the one also holding the embedding (the head) may hold none
    if f is None or l_ is None or f < virtual - 1 or l_ < virtual - 1:
        return None
    if pipeline == 2:
        return (f, l_, None) if f + l_ == layers else None
    rest, between = layers - f - l_, (pipeline - 2) * virtual
    return (f, l_, rest // between) if rest > 0 and rest % between == 0 else None


def _uneven_examples(layers: int, pipeline: int, virtual: int = 1) -> str:
    """Shortened first and last stages that split ``layers`` over ``pipeline`` stages of
    ``virtual`` chunks, the least shortened first: both the same where any such split exists,
    else the first one block shorter than the last (it also holds the embedding), as an odd
    count needs (DeepSeek-V3's 61 blocks over 16 stages: 2 and 3, 4 in each other stage)."""
    if pipeline == 2:
        half = layers // 2
        return f"first = {half}, last = {layers - half}" if half >= max(1, virtual - 1) else ""
    for gap in (0, 1):
        shorter, longer = [], []
        for k in range(max(1, virtual - 1), layers):
            rest = layers - 2 * k - gap
            if rest > 0 and rest % ((pipeline - 2) * virtual) == 0:
                middle = rest // (pipeline - 2)
                named = f"first = last = {k}" if gap == 0 else f"first = {k}, last = {k + gap}"
                (shorter if middle >= k + gap else longer).append(f"{named} ({middle} in each other stage)")
        if shorter or longer:
            return "; ".join(shorter[-3:][::-1] or longer[:3])
    return ""
