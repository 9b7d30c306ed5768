"""ZeRO-1 as Megatron-LM's distributed optimizer runs it, on PyTorch's DDP.

Megatron-LM (``megatron/core/distributed/param_and_grad_buffer.py``,
``megatron/core/optimizer/distrib_optimizer.py``) keeps each model chunk's gradients in one
contiguous buffer split into buckets; with ``--use-distributed-optimizer`` a bucket whose
gradients are all ready is reduce-scattered over the data-parallel group (overlapped with
backward: ``--overlap-grad-reduce``), each rank owning an even share of every bucket; each rank
updates the optimizer state and the parameters of its share only, and the parameters are
all-gathered bucket by bucket before the next forward needs them (``--overlap-param-gather``:
dispatched as the forward starts, waited per bucket). PyTorch has no such engine; it is written
here on PyTorch's own pieces:

- the gradient buffer and its buckets are DDP's (``gradient_as_bucket_view``: the gradients
  are views of the buckets, one copy as in Megatron), with the steady-state bucket order DDP
  rebuilds after its first step (``trace.parallel.data``), and the reduce-scatter a DDP
  communication hook (``reduce_scatter_hook``);
- each bucket's parameters are views of one flat buffer laid out as the bucket is, so the
  all-gather writes them in place (``ShardedBuckets``);
- the optimizer is the step's own (``torch.optim.AdamW`` ...) over this rank's share of each
  bucket (``DistributedOptimizer``).

A bucket's share is ``n // dp`` elements per rank. Megatron pads its buffers so every bucket
divides; DDP's do not, so the last ``n % dp`` elements (fewer than ``dp``) of such a bucket are
all-reduced and updated by every rank: one small all-reduce more per such bucket, and at most
``dp - 1`` elements of replicated optimizer state.

A model in bf16 or fp16 (``--dtype``) is optimized as Megatron-LM's mixed-precision optimizers
do (``megatron/core/optimizer/distrib_optimizer.py``: ``shard_fp32_from_float16_groups``): each
rank keeps an fp32 copy of its shares (the main parameters), the optimizer and its state are
over those, and each step casts the shares' gradients to fp32 first
(``_copy_model_grads_to_main_grads``) and the updated main parameters back into the shares
after (``_copy_main_params_to_model_params``), which the all-gather then spreads. Per element of
its shares a rank holds 4 bytes of main parameter and, with Adam, two fp32 moments: the 12 bytes
of Megatron's distributed-optimizer memory formula. Gradient clipping reads the shares' own
gradients (Megatron clips the fp32 copies: the same elements at twice the bytes).

With ``Execution.grad_reduce_in_fp32`` (Megatron-LM's main gradients: its default for --bf16,
``--accumulate-allreduce-grads-in-fp32``) each bucket also has an fp32 buffer of its gradients
(``Bucket.main_grad``, allocated with the model: persistent, as Megatron's ``main_grad`` buffer
is): the reduction casts the bucket's gradients into it and reduce-scatters it in fp32 (twice the
bytes), and the fp32 main parameters take their shares of it as their gradients, with no cast
at the step; clipping reads them (Megatron clips its fp32 main gradients). Megatron's fused
weight-gradient GEMMs accumulate into that fp32 buffer directly; here the micro-batches
accumulate in DDP's 16-bit bucket, standing in for the GEMMs' outputs: its traffic is timed, its
bytes are not held (``unheld_gradients``), so a rank holds Megatron's 4 bytes of gradient a
parameter. The cast is one elementwise pass a step.

Recipes keep less (``Execution.optimizer_states``, ``layout.OPTIMIZER_STATES``): Megatron-Core's
precision-aware optimizer keeps the moments in bf16 beside the fp32 main parameter (8 bytes; its
step is Transformer Engine's FusedAdam, one fused kernel over both dtypes, traced as PyTorch's
fused AdamW over the fp32 main parameters with the moments made bf16 first), and Apex's
DistributedFusedAdam in bf16 beside a bf16 model keeps only bf16 moments and updates the share
itself (4 bytes).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from nnperf.errors import UsageError
from nnperf.layout import OPTIMIZER_STATES, OptimizerStates

#: Set on the model a layout wraps for ZeRO-1: the ``ShardedBuckets`` of each of its DDP modules
#: (a pipeline rank has one per chunk); ``trace.step.make_optimizer`` builds the optimizer on them.
SHARDED_BUCKETS = "nnperf_sharded_buckets"


#: The dtypes whose shares get a main parameter (Megatron-LM's ``--bf16`` and ``--fp16``).
LOW_PRECISION = (torch.bfloat16, torch.float16)
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass
class Bucket:
    """One DDP bucket's parameters, their flat buffer and this rank's share of it, over the
    ``size`` ranks of ``group`` it is sharded over (the data-parallel group; an expert's bucket,
    its expert-data-parallel group)."""

    params: list[nn.Parameter]
    flat: torch.Tensor  # the parameters' storage, in the bucket's order
    share: nn.Parameter  # flat[rank * per : (rank + 1) * per]: updated here
    tail: nn.Parameter | None  # flat[size * per:], fewer than size elements: updated by every rank
    per: int  # elements of one rank's share
    group: Any
    rank: int
    size: int
    #: the bucket's fp32 main gradients (``grad_reduce_in_fp32``), reduce-scattered in place of
    #: ``flat``'s 16-bit ones; None: reduced in the model's dtype
    main_grad: torch.Tensor | None = None
    #: the fp32 main parameters of ``share`` and ``tail`` (``DistributedOptimizer``), which take
    #: their slices of ``main_grad`` as gradients
    main_share: nn.Parameter | None = None
    main_tail: nn.Parameter | None = None


@dataclass
class ShardedBuckets:
    """A DDP module's buckets, its data-parallel ``group`` (of ``size`` ranks: every gradient is
    averaged over them); ``needs_gather``: the shares were updated since the parameters were
    last all-gathered."""

    group: Any
    rank: int
    size: int
    buckets: list[Bucket] = field(default_factory=list)
    needs_gather: bool = True
    #: what the optimizer keeps per element (``layout.OPTIMIZER_STATES``)
    states: OptimizerStates = OPTIMIZER_STATES["fp32"]

    def optimized(self) -> Iterator[nn.Parameter]:
        for bucket in self.buckets:
            yield bucket.share
            if bucket.tail is not None:
                yield bucket.tail

    def gather(self) -> None:
        """All-gather every bucket's updated shares into its flat buffer (the parameters), in
        forward order (DDP's buckets are in backward order)."""
        self.needs_gather = False
        for bucket in reversed(self.buckets):
            if bucket.per:
                with warnings.catch_warnings():  # renamed all_gather_single in recent torch; same op
                    warnings.simplefilter("ignore", FutureWarning)
                    dist.all_gather_into_tensor(bucket.flat[:bucket.size * bucket.per], bucket.share.data,
                                                group=bucket.group)


def shard_buckets(module: nn.Module, buckets: list[list[int]], group: Any,
                  bucket_groups: list[Any] | None = None,
                  states: OptimizerStates = OPTIMIZER_STATES["fp32"], main_grads: bool = False) -> ShardedBuckets:
    """Lay each bucket's parameters (indices into ``module``'s trainable parameters, in the
    bucket's order) out in one flat buffer, rebinding the module's parameters to views of it,
    and cut this rank's share over ``bucket_groups[i]`` (default: every bucket over ``group``,
    the data-parallel group). Called before DDP wraps ``module``, which then holds the views.
    ``main_grads``: each bf16 or fp16 bucket gets an fp32 buffer of its gradients too
    (``Execution.grad_reduce_in_fp32``)."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    bucket_groups = bucket_groups or [group] * len(buckets)
    params = [p for p in module.parameters() if p.requires_grad]
    owners = {id(p): [] for p in params}
    for sub in module.modules():
        for name, p in sub._parameters.items():
            if p is not None and id(p) in owners:
                owners[id(p)].append((sub, name))
    sharded = ShardedBuckets(group, rank, size, states=states)
    for indices, over in zip(buckets, bucket_groups, strict=True):
        members = [params[i] for i in indices]
        numel = sum(p.numel() for p in members)
        flat = torch.empty(numel, dtype=members[0].dtype, device=members[0].device)
        views = []
        offset = 0
        for p in members:
            with torch.no_grad():
                view = flat[offset:offset + p.numel()].view_as(p)
                view.copy_(p)
            new = nn.Parameter(view, requires_grad=p.requires_grad)
            for sub, name in owners[id(p)]:  # tied weights stay one parameter
                sub._parameters[name] = new
            views.append(new)
            offset += p.numel()
        mine, ranks = dist.get_rank(over), dist.get_world_size(over)
        per = numel // ranks
        share = nn.Parameter(flat[mine * per:(mine + 1) * per], requires_grad=True)
        tail = nn.Parameter(flat[ranks * per:], requires_grad=True) if numel % ranks else None
        main_grad = (torch.zeros(numel, dtype=torch.float32, device=flat.device)
                     if main_grads and flat.dtype in LOW_PRECISION else None)
        sharded.buckets.append(Bucket(views, flat, share, tail, per, over, mine, ranks, main_grad))
    return sharded


def reduce_scatter_hook(state: ShardedBuckets, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket's gradients and reduce-scatter them: this rank's share of the bucket's
    buffer holds the sum of every rank's (and the tail, fewer than ``dp`` elements, is
    all-reduced); the share's gradient is that part of the buffer."""
    buffer = bucket.buffer()
    mine = state.buckets[bucket.index()]
    got, want = bucket.parameters(), mine.params
    if len(got) != len(want) or any(a is not b for a, b in zip(got, want, strict=True)):
        raise RuntimeError("DDP's bucket is not the one the distributed optimizer laid out")
    per, size, rank = mine.per, mine.size, mine.rank
    main = mine.main_grad
    if main is not None:  # Megatron's fp32 main gradients: reduced in fp32, handed to the main parameters
        main.copy_(buffer)
    reduced = buffer if main is None else main
    reduced.div_(state.size)  # Megatron scales by 1 / dp before reducing (an expert's bucket too)
    if per:
        with warnings.catch_warnings():  # renamed reduce_scatter_single in recent torch; same op
            warnings.simplefilter("ignore", FutureWarning)
            dist.reduce_scatter_tensor(reduced[rank * per:(rank + 1) * per], reduced[:size * per], group=mine.group)
        mine.share.grad = buffer[rank * per:(rank + 1) * per]
        if mine.main_share is not None:
            mine.main_share.grad = reduced[rank * per:(rank + 1) * per]
    if mine.tail is not None:
        dist.all_reduce(reduced[size * per:], group=mine.group)
        mine.tail.grad = buffer[size * per:]
        if mine.main_tail is not None:
            mine.main_tail.grad = reduced[size * per:]
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(buffer)
    return future


# DDP checks a hook's annotations as objects (this module's are strings: __future__).
reduce_scatter_hook.__annotations__.update(state=ShardedBuckets, bucket=dist.GradBucket,
                                           **{"return": torch.futures.Future[torch.Tensor]})


def gather_before_forward(ddp: nn.Module, sharded: ShardedBuckets) -> None:
    """Megatron's ``--overlap-param-gather``: the parameters updated by the last step are
    all-gathered as the next forward starts (every bucket's issued at once, in forward order;
    each compute kernel waits for the bucket it reads), once per step however many
    micro-batches run forward."""
    def gather(module: nn.Module, args: Any) -> None:
        if sharded.needs_gather:
            sharded.gather()

    ddp.register_forward_pre_hook(gather)


class DistributedOptimizer:
    """The step's optimizer (``optimizer_class`` with ``kwargs``, from
    ``trace.step.make_optimizer``) over this rank's share of every bucket, each bf16 or fp16
    share through a main copy where the buckets' states keep one (fp32 unless asked otherwise:
    the module docstring; an fp32 share is optimized itself, as Megatron-LM's
    ``shard_fp32_groups``). ``step`` updates the shares and marks the parameters for the
    all-gather before the next forward (``gather_before_forward``)."""

    def __init__(self, optimizer_class: type[torch.optim.Optimizer], kwargs: dict[str, Any],
                 sharded: list[ShardedBuckets]) -> None:
        self.sharded = sharded
        self.shares = [p for s in sharded for p in s.optimized()]
        states = sharded[0].states if sharded else OPTIMIZER_STATES["fp32"]
        low = {s.dtype for s in self.shares if s.dtype in LOW_PRECISION}
        if states.main is None and low != {_DTYPES[states.moments]}:
            raise UsageError(f"optimizer states {states.name} update the model's own {states.moments} parameters: "
                             f"they need a model in {states.moments} (--dtype {states.moments})")
        if states.moments != "fp32" and optimizer_class not in (torch.optim.Adam, torch.optim.AdamW):
            raise UsageError(f"optimizer states {states.name} hold Adam's moments: they need adam or adamw")
        #: the main parameter of each bf16 or fp16 share, by its position in ``shares``
        self.main = {i: nn.Parameter(s.detach().to(_DTYPES[states.main]), requires_grad=True)
                     for i, s in enumerate(self.shares) if states.main is not None and s.dtype in LOW_PRECISION}
        self._bind_main_gradients()
        optimized = [self.main.get(i, s) for i, s in enumerate(self.shares)]
        mixed = states.main is not None and states.moments != states.main  # TE's FusedAdam: one fused step
        if mixed:
            kwargs = {**{k: v for k, v in kwargs.items() if k != "foreach"}, "fused": True}
        self.optimizer = optimizer_class(optimized, **kwargs)
        if mixed:
            for p in optimized:
                self.optimizer.state[p] = _moments(p, _DTYPES[states.moments])

    def _bind_main_gradients(self) -> None:
        """Tell each bucket with fp32 main gradients the main parameters of its share and tail,
        which its reduction hands their slices to (``reduce_scatter_hook``)."""
        i = 0
        for s in self.sharded:
            for bucket in s.buckets:
                bucket.main_share = self.main.get(i) if bucket.main_grad is not None else None
                i += 1
                if bucket.tail is not None:
                    bucket.main_tail = self.main.get(i) if bucket.main_grad is not None else None
                    i += 1

    def gradient_params(self) -> list[nn.Parameter]:
        """What backward leaves gradients on for the step (what clipping and a GradScaler read):
        the fp32 main parameters where the buckets reduce fp32 main gradients into them, the
        shares elsewhere (their main parameters get theirs inside ``step``, as Megatron's
        ``_copy_model_grads_to_main_grads`` does)."""
        mains = {id(p) for s in self.sharded for b in s.buckets for p in (b.main_share, b.main_tail) if p is not None}
        return [main if main is not None and id(main) in mains else share
                for share, main in ((share, self.main.get(i)) for i, share in enumerate(self.shares))]

    def unheld_gradients(self) -> list[nn.Parameter]:
        """The model's parameters whose 16-bit gradients (DDP's buckets) stand beside fp32 main
        gradients: Megatron's fused accumulation holds only the fp32 buffer, so their bytes are
        not held (``vocab.StorageKind.UNHELD_GRADIENT``), their traffic is."""
        return [p for s in self.sharded for b in s.buckets if b.main_grad is not None for p in b.params]

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    @property
    def state(self) -> dict[nn.Parameter, dict[str, Any]]:
        """What this rank holds for each share: the optimizer's state, and its fp32 main
        parameter where it has one (Megatron counts it as optimizer state)."""
        out = {}
        for i, share in enumerate(self.shares):
            main = self.main.get(i)
            state = self.optimizer.state.get(main if main is not None else share, {})
            out[share] = {**state, "main_param": main} if main is not None else state
        return out

    def register_step_pre_hook(self, hook: Any) -> Any:
        """``torch.optim.Optimizer``'s hook before each step, called with this optimizer."""
        return self.optimizer.register_step_pre_hook(lambda _, args, kwargs: hook(self, args, kwargs))

    def register_step_post_hook(self, hook: Any) -> Any:
        """``torch.optim.Optimizer``'s hook after each step (a GradScaler's callbacks)."""
        return self.optimizer.register_step_post_hook(lambda _, args, kwargs: hook(self, args, kwargs))

    def step(self, closure: Any = None) -> Any:
        """The shares' gradients are set: by the reduce-scatter, or before the trace's warm-up
        step (``trace.capture``, through ``trace.step.gradient_params``)."""
        for i, main in self.main.items():  # Megatron's _copy_model_grads_to_main_grads (none for main gradients)
            if main.grad is None:
                main.grad = self.shares[i].grad.to(main.dtype)
        result = self.optimizer.step(closure)
        with torch.no_grad():  # and _copy_main_params_to_model_params
            for i, main in self.main.items():
                self.shares[i].copy_(main)
        for s in self.sharded:
            s.needs_gather = True
        return result

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The shares' gradients (views of DDP's buckets, bound again by the next reduce-scatter)
        and the main parameters' (made again by the next step) dropped, and the model's: set to
        None, or zeroed in their buckets, as Megatron-LM zeroes its gradient buffer."""
        for p in [*self.shares, *self.main.values()]:
            p.grad = None
        for s in self.sharded:
            for bucket in s.buckets:
                for p in bucket.params:
                    if set_to_none:
                        p.grad = None
                    elif p.grad is not None:
                        p.grad.zero_()

    def finish(self) -> None:
        """All-gather the last update now (where no forward follows: a check of the weights)."""
        for s in self.sharded:
            if s.needs_gather:
                s.gather()


def _moments(param: torch.Tensor, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Adam's state for ``param`` with its moments in ``dtype``, as PyTorch's fused AdamW makes it
    on its first step (``torch.optim.adamw._init_group``: an fp32 step count on the device,
    moments shaped like the parameter) but for the moments' dtype, which the fused step takes
    as it comes, as Transformer Engine's FusedAdam does."""
    return {"step": torch.zeros((), dtype=torch.float32, device=param.device),
            "exp_avg": torch.zeros_like(param, dtype=dtype, memory_format=torch.preserve_format),
            "exp_avg_sq": torch.zeros_like(param, dtype=dtype, memory_format=torch.preserve_format)}
