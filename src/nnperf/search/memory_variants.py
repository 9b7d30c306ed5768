"""Trace a workload the way the memory questions need: with checkpointing and accumulation.

``nnperf.analyze`` traces the plain step; memory what-ifs change the step itself
(activation checkpointing recomputes blocks in backward, gradient accumulation starts the
step with gradients allocated), so they are traced rather than adjusted after the fact.
"""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from nnperf.errors import UsageError
from nnperf.kernels.grouped_gemm import GROUPED_MM
from nnperf.loading import resolve
from nnperf.request import ModelRequest
from nnperf.trace.assumptions import assume
from nnperf.trace.blocks import repeated_blocks
from nnperf.trace.capture import trace_workload
from nnperf.trace.events import Trace, op_name
from nnperf.trace.options import TraceOptions
from nnperf.trace.recorder import GraphLabeler, ModuleStack, recomputing_module
from nnperf.workload import Workload


@dataclass(frozen=True)
class MemoryOptions:
    """One configuration of the step whose memory is asked for: how the step is traced, plus
    the training-loop settings that change what is alive during it."""

    trace: TraceOptions = field(default_factory=TraceOptions)
    grad_accum: int = 1  # micro-batches per optimizer step
    set_to_none: bool = True  # zero_grad(set_to_none=...)
    # activation checkpointing of every repeated block: True (or "full") recomputes each
    # block's forward; "selective" keeps the matrix products' outputs and recomputes the rest
    checkpoint: bool | str = False

    def validate(self) -> None:
        if self.grad_accum < 1:
            raise UsageError(f"invalid --grad-accum {self.grad_accum}: must be 1 or more")

    @property
    def grads_persist(self) -> bool:
        """Whether the steady-state step starts with gradients allocated."""
        return self.trace.train and (self.grad_accum > 1 or not self.set_to_none)

    def trace_options(self) -> TraceOptions:
        """``trace`` with ``grads_persist`` decided by the accumulation and zero_grad settings."""
        return replace(self.trace, grads_persist=self.grads_persist)

    def with_(self, **changes: Any) -> MemoryOptions:
        """A what-if: ``changes`` to this configuration's own fields or to its trace options."""
        own = {f.name for f in fields(self)}
        trace = {k: v for k, v in changes.items() if k not in own}
        mine = {k: v for k, v in changes.items() if k in own}
        return replace(self, trace=replace(self.trace, **trace), **mine)

    def describe(self) -> str:
        parts = [self.trace.describe()]
        if self.checkpoint:
            parts.append("selective activation checkpointing" if self.checkpoint == "selective"
                         else "activation checkpointing")
        if self.grad_accum > 1:
            parts.append(f"grad accumulation x{self.grad_accum}")
        if not self.set_to_none:
            parts.append("zero_grad(set_to_none=False)")
        return ", ".join(parts)


#: What selective checkpointing keeps: the outputs of matrix products with weights and of
#: fused attention (expensive to recompute); everything else (pointwise ops, norms, softmax,
#: dropout, products of two activations such as attention scores) is recomputed in backward,
#: as in Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
#: Models", selective recomputation of the attention core) and PyTorch's selective
#: activation checkpointing.
SAVED_BY_SELECTIVE = frozenset({
    "aten.mm", "aten.addmm", "aten.linear", "aten.convolution", "aten.cudnn_convolution",
    "nnperf.attention", "aten._scaled_dot_product_flash_attention",
    "aten._scaled_dot_product_efficient_attention",
    GROUPED_MM, "_c10d_functional.all_to_all_single",  # experts' GEMMs; tokens sent once
    "higher_order.flex_attention",
})

#: torchtitan's per-op selective checkpointing (``selective_ac_option = "op"``), as it ran for
#: its published Llama numbers: torchtitan/parallelisms/parallelize_llama.py ``_save_list`` and
#: ``_custom_policy`` at commits 0413364 (2024-04, docs/performance.md, then named
#: ``no_recompute_list``) and 9dec370 (2024-12, benchmarks/llama3_h100_202412_torchtitan.md):
#: the outputs of ``aten.mm``, the flash and memory-efficient SDPA kernels and the
#: tensor-parallel reduce-scatter are saved (and of ``abs``/``max``, for Float8 scales),
#: everything else is recomputed, and so is every second ``aten.mm`` of a block ("Saves output
#: of all compute ops, except every second mm"), counted separately in the forward and in the
#: recomputation. The trace's SDPA stand-in ``nnperf.attention`` counts as SDPA, and
#: FlexAttention's kernel is saved too (it joined the list in torchtitan commit f738a03,
#: 2025-08; at HEAD: distributed/activation_checkpoint.py). ``addmm`` (a
#: linear with a bias) is not on the list: torchtitan's Llama has no biases. The expert-parallel
#: all-to-all joined the list with torchtitan's MoE models (its ``_op_sac_save_list`` in
#: torchtitan/models/llama4 and deepseek_v3 ``infra/parallelize.py``); dense models call none.
#: Before that, its MoE models ran llama3's list (torchtitan commit f738a03, 2025-08,
#: torchtitan/models/llama3/infra/parallelize.py ``_save_list``: mm, the two SDPA kernels,
#: reduce-scatter, max, flex attention): ``selective-op-recompute-a2a``.
SAVED_BY_TORCHTITAN_OP = frozenset({
    "aten.mm.default", "nnperf.attention.default", "aten._scaled_dot_product_flash_attention.default",
    "aten._scaled_dot_product_efficient_attention.default",
    "_c10d_functional.reduce_scatter_tensor.default", "aten.abs.default", "aten.max.default",
    "_c10d_functional.all_to_all_single.default", "higher_order.flex_attention",
})

#: The selective policies by the name a layout gives them (``Execution.checkpoint``); the
#: names themselves live with ``Execution`` (``nnperf.layout.CHECKPOINTS``).
SELECTIVE_POLICIES = ("selective", "selective-op", "selective-op-recompute-a2a", "selective-attention")
_ALL_TO_ALL = "_c10d_functional.all_to_all_single.default"


def _op_name(op: Any, overload: bool = False) -> str:
    """The trace's name of ``op`` (``events.op_name``), with its overload where asked
    (a higher-order op, FlexAttention's, has none)."""
    name = op_name(op)
    if not overload or getattr(op, "_schema", None) is None:
        return name
    return f"{name}.{getattr(op, '_overloadname', 'default') or 'default'}"


def _policy(kind: str) -> Callable[..., Any]:
    """The per-op decision of one selective policy, for one checkpointed call (the op policy
    counts matrix products per call, as torchtitan's does with a fresh ``meta`` per call)."""
    from torch.utils.checkpoint import CheckpointPolicy

    save, recompute = CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_RECOMPUTE
    if kind == "selective":
        return lambda ctx, op, *args, **kwargs: save if _op_name(op) in SAVED_BY_SELECTIVE else recompute
    if kind not in ("selective-op", "selective-op-recompute-a2a"):
        raise UsageError(f"unknown selective checkpointing policy {kind!r}; valid: {', '.join(SELECTIVE_POLICIES)}")
    saved = SAVED_BY_TORCHTITAN_OP - ({_ALL_TO_ALL} if kind == "selective-op-recompute-a2a" else set())
    mms: Counter[str] = Counter()

    def every_second_mm(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
        name = _op_name(op, overload=True)
        mode = "recompute" if ctx.is_recompute else "forward"
        if name == "aten.mm.default":
            mms[mode] += 1
            if mms[mode] % 2 == 0:
                return recompute
        return save if name in saved else recompute

    return every_second_mm


def _recompute_context(block: str | None = None) -> tuple[contextlib.AbstractContextManager, Any]:
    """Recomputation runs on the autograd thread, outside the tracer's function mode; apply the
    tracer's substitutions there too (fused attention, native dropout, the assumed MoE
    routing), so the recomputed forward matches the original one op for op; a checkpointed
    ``block`` (its wrapped forward, which no module hook enters) recomputes as that block
    (``recomputing_module``)."""
    labeler = GraphLabeler(ModuleStack({}), _active_routing())
    if block is None:
        return contextlib.nullcontext(), labeler
    return contextlib.nullcontext(), _Both(recomputing_module(block), labeler)


def _active_routing() -> Any:
    """The MoE routing the tracer assumes in the forward under way (None outside a trace)."""
    from torch.overrides import _get_current_function_mode_stack

    labelers = [m for m in _get_current_function_mode_stack() if isinstance(m, GraphLabeler)]
    return labelers[-1]._routing if labelers else None


def _selective_context(kind: str = "selective", block: str | None = None) -> tuple[Any, Any]:
    """Selective checkpointing's contexts for one checkpointed call under policy ``kind``, the
    recomputation also under the tracer's substitutions (see ``_recompute_context``)."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    forward, recompute = create_selective_checkpoint_contexts(_policy(kind))
    _, labeler = _recompute_context(block)
    return forward, _Both(recompute, labeler)


class _Both(contextlib.AbstractContextManager):
    """Two contexts entered as one. A module-level class on purpose: a class made per call is
    a reference cycle (every class is), and its methods' closures would hold the recompute
    context and with it selective checkpointing's cache of saved outputs; the outputs the
    early-stopped recomputation never asks for (a block's last matrix product) would then
    live until Python's cycle collector happens to run, so the traced memory depended on the
    process's allocation history (up to 20% of a 70B layout's peak)."""

    def __init__(self, *contexts: Any) -> None:
        self._contexts = contexts
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> Any:
        for context in self._contexts:
            self._stack.enter_context(context)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stack.close()


#: Megatron-LM's selective recomputation (``--recompute-activations``, i.e.
#: ``--recompute-granularity selective``; Korthikanti et al. 2022, section 5): the core attention
#: alone (scores, softmax, dropout, weighted sum) is checkpointed and runs again in backward;
#: the rest of the block is plain autograd, so it keeps what it would keep without
#: recomputation (Megatron-LM's ``_checkpointed_attention_forward`` around ``CoreAttention``;
#: Megatron-Core's ``TransformerBlock`` checkpoints ``core_attention`` the same way).
CORE_ATTENTION = "selective-attention"


class CoreAttention(nn.Module):
    """A block's core attention as a module of its own (``block.core_attention``), so its
    recomputation in backward is a module's forward the trace attributes and marks recomputed,
    as Megatron-LM's ``CoreAttention`` module is. It holds no parameters."""

    def forward(self, attend: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return attend(*args, **kwargs)


class _CheckpointedAttention(TorchFunctionMode):
    """Inside one block's forward: every ``F.scaled_dot_product_attention`` runs in
    non-reentrant ``torch.utils.checkpoint`` through the block's ``CoreAttention``, which keeps
    only the attention's inputs (the attention's own backward keeps them anyway) and recomputes
    its output in backward, under the tracer's substitutions (``_recompute_context``). Whole:
    Megatron-LM's checkpoint is reentrant and runs the function to its end (unfused, the
    product with the values too), where a non-reentrant one would stop at the last tensor
    backward needs."""

    def __init__(self, core: CoreAttention) -> None:
        super().__init__()
        self.core = core
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            self.calls += 1
            with set_checkpoint_early_stop(False):
                return checkpoint(self.core, func, *args, use_reentrant=False, context_fn=_recompute_context,
                                  **kwargs)
        return func(*args, **kwargs)


def _core_attention_checkpointed(forward: Callable[..., Any], core: CoreAttention, block: str,
                                 *args: Any, **kwargs: Any) -> Any:
    """A block's forward with its core attention checkpointed; a block that attends some other
    way (FlexAttention, matrix products of its own) recomputes nothing, and the trace says so."""
    mode = _CheckpointedAttention(core)
    with mode:
        out = forward(*args, **kwargs)
    if not mode.calls:
        assume(f"{CORE_ATTENTION} checkpointing: block {block} calls no F.scaled_dot_product_attention, "
               "so nothing of it is recomputed")
    return out


def apply_checkpointing(workload: Workload, selective: bool | str = False) -> list[str]:
    """Wrap each block's forward in non-reentrant ``torch.utils.checkpoint``; returns the blocks.
    ``selective``: False recomputes each block whole, True or a name in ``SELECTIVE_POLICIES``
    recomputes part of it (True: nnperf's "selective"); ``CORE_ATTENTION`` checkpoints each
    block's attention alone (``CoreAttention``)."""
    from torch.utils.checkpoint import checkpoint

    kind = "selective" if selective is True else selective
    if kind and kind != CORE_ATTENTION:
        _policy(kind)  # an unknown name is one line, before any block is wrapped
    blocks = repeated_blocks(workload.model)
    modules = dict(workload.model.named_modules())
    for name in blocks:
        module = modules[name]
        if kind == CORE_ATTENTION:
            module.core_attention = CoreAttention()
            module.forward = functools.partial(_core_attention_checkpointed, module.forward,  # type: ignore[method-assign]
                                               module.core_attention, name)
            continue
        module.forward = functools.partial(  # type: ignore[method-assign]
            checkpoint, module.forward, use_reentrant=False,
            context_fn=(functools.partial(_selective_context, kind, name) if kind
                        else functools.partial(_recompute_context, name)),
        )
    return blocks


def trace_memory(request: ModelRequest, options: MemoryOptions) -> tuple[str, Trace, Workload]:
    """Resolve the requested workload and trace one step of it under ``options``."""
    options.validate()
    name, build = resolve(request)
    blocks: list[str] = []

    def build_with_checkpoints() -> Workload:
        workload = build()
        blocks.extend(apply_checkpointing(workload, selective=options.checkpoint == "selective"))
        return workload

    trace, workload = trace_workload(build_with_checkpoints if options.checkpoint else build,
                                     options.trace_options())
    trace.config["memory_options"] = {
        "grad_accum": options.grad_accum,
        "set_to_none": options.set_to_none,
        "checkpoint": options.checkpoint,
        "checkpointed_blocks": len(blocks),
    }
    return name, trace, workload
