"""The loss as ``torch.compile`` runs it (``--loss compiled``), or chunked as torchtitan's
``ChunkedLossWrapper`` runs it (``--loss chunked``, ``chunked-compiled``).

Eager ``F.cross_entropy`` over a language model's logits is log-softmax plus NLL: under bf16
autocast (or torchtitan's ``pred.float()``) an fp32 copy of the logits, an fp32 log-softmax
kept for backward, and in backward an fp32 zero-filled gradient, the log-softmax gradient and
its cast back, each as large as the logits. With a 100k-token vocabulary that is tens of GiB
at the end of the forward pass, where the step's memory peaks. torchtitan compiles the loss
(``[compile] components = ["loss"]``) and Liger-style fused losses do the same job by hand.

What inductor makes of it, checked with the partitioner it uses
(``min_cut_rematerialization_partition`` over ``select_decomp_table()`` decompositions; the
test runs that reference): forward keeps the logits in their own dtype, the integer targets,
each row's maximum and log-sum-exp remainder (fp32, one per row) and, for ``mean``, the count
of targets not ignored; backward recomputes ``softmax = exp(x - max - log_sum)`` from the
logits and writes the gradient in the logits' dtype, so no fp32 tensor of the logits' size ever
reaches memory. Inductor's online softmax (``torch._inductor.config.online_softmax``, on by
default) reads the logits once in forward; backward reads them once and writes the gradient.

The tracer routes every ``F.cross_entropy`` the loss function calls through the fused ops
``nnperf::cross_entropy`` and ``nnperf::cross_entropy_backward`` (one record each, the costs in
``passes.costs.losses``); a measured step runs ``torch.compile(loss_fn)`` itself. Class weights,
probability targets and spatial (N, C, d...) inputs are traced eagerly, and the trace says so.
A user loss that upcasts explicitly (``pred.float()``) is traced as written: the fp32 copy is
recorded and handed to the fused op, which keeps it; call ``F.cross_entropy`` on the
low-precision logits under autocast to get inductor's figure.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nnperf.errors import UsageError
from nnperf.trace.assumptions import assume
from nnperf.trace.options import CHUNKED_LOSSES

#: torchtitan's ChunkedLossWrapper default (``num_chunks = 8``).
DEFAULT_CHUNKS = 8
REDUCTIONS = ("mean", "sum", "none")

NO_CROSS_ENTROPY = ("--loss compiled changes nothing here: the loss function calls no F.cross_entropy "
                    "(nn.CrossEntropyLoss) on the logits; leave it out")


def _forward_math(logits: Tensor, target: Tensor, ignore_index: int, reduction: str,
                  label_smoothing: float) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    x = logits.float()
    row_max = x.amax(dim=-1)
    log_sum = torch.log(torch.exp(x - row_max.unsqueeze(-1)).sum(dim=-1))
    lse = row_max + log_sum
    keep = target != ignore_index
    picked = x.gather(-1, torch.where(keep, target, 0).unsqueeze(-1)).squeeze(-1)
    per_row = lse - picked
    if label_smoothing:  # PyTorch: (1 - e) NLL + e * mean over classes of -log p
        per_row = (1 - label_smoothing) * per_row + label_smoothing * (lse - x.mean(dim=-1))
    per_row = torch.where(keep, per_row, 0.0)
    count = keep.sum().float()
    if reduction == "mean":
        loss = per_row.sum() / count
    elif reduction == "sum":
        loss = per_row.sum()
    else:
        loss = per_row
    return loss, row_max, log_sum, count, keep


@torch.library.custom_op("nnperf::cross_entropy", mutates_args=())
def cross_entropy(logits: Tensor, target: Tensor, ignore_index: int, reduction: str,
                  label_smoothing: float) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Fused cross entropy over (N, C) logits: the loss (fp32), each row's maximum and the log
    of its sum of exponentials (fp32), the count of targets not ignored and which rows are not."""
    return _forward_math(logits, target, ignore_index, reduction, label_smoothing)


@cross_entropy.register_fake
def _cross_entropy_fake(logits, target, ignore_index, reduction, label_smoothing):
    rows = logits.shape[:-1]
    loss = logits.new_empty(rows if reduction == "none" else (), dtype=torch.float32)
    return (loss, logits.new_empty(rows, dtype=torch.float32), logits.new_empty(rows, dtype=torch.float32),
            logits.new_empty((), dtype=torch.float32), logits.new_empty(rows, dtype=torch.bool))


@torch.library.custom_op("nnperf::cross_entropy_backward", mutates_args=())
def cross_entropy_backward(grad: Tensor, logits: Tensor, target: Tensor, row_max: Tensor,
                           log_sum: Tensor, count: Tensor | None, ignore_index: int, reduction: str,
                           label_smoothing: float) -> Tensor:
    """The logits' gradient in their dtype: (softmax - (1 - e) onehot - e / C) times the
    upstream gradient (over the count for ``mean``), zero on ignored rows."""
    x = logits.float()
    p = torch.exp(x - (row_max + log_sum).unsqueeze(-1))
    keep = target != ignore_index
    onehot = F.one_hot(torch.where(keep, target, 0), x.shape[-1]).float()
    d = p - (1 - label_smoothing) * onehot - label_smoothing / x.shape[-1]
    g = grad.float()
    if reduction == "mean":
        g = g / count
    scale = g.unsqueeze(-1) if reduction == "none" else g
    out = torch.where(keep.unsqueeze(-1), d * scale, 0.0)
    return out.to(logits.dtype)


@cross_entropy_backward.register_fake
def _cross_entropy_backward_fake(grad, logits, target, row_max, log_sum, count, ignore_index, reduction,
                                 label_smoothing):
    return torch.empty_like(logits)


def _setup_context(ctx, inputs, output):
    logits, target, ignore_index, reduction, label_smoothing = inputs
    _, row_max, log_sum, count, keep = output
    # what inductor's partitioner keeps (module docstring): the count only where backward divides
    # by it, the rows' mask only with label smoothing (its partitioner saves it there)
    ctx.save_for_backward(logits, target, row_max, log_sum, count if reduction == "mean" else None,
                          keep if label_smoothing else None)
    ctx.params = (ignore_index, reduction, label_smoothing)
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_loss, *_unused):
    logits, target, row_max, log_sum, count, _ = ctx.saved_tensors
    grad = torch.ops.nnperf.cross_entropy_backward(grad_loss, logits, target, row_max, log_sum, count,
                                                   *ctx.params)
    return grad, None, None, None, None


cross_entropy.register_autograd(_backward, setup_context=_setup_context)


_TRACING = [0]  # inside a trace (tracing()): compiled losses run as the fused ops
_IN_COMPILED_LOSS = [0]
_CALLS = [0]

#: ``F.cross_entropy``'s parameters in order, to bind a call's positional arguments by name.
CROSS_ENTROPY_PARAMS = ("input", "target", "weight", "size_average", "ignore_index", "reduce", "reduction",
                        "label_smoothing")


def unfusable(args: dict[str, Any]) -> str | None:
    """Why a cross_entropy call stays eager under ``--loss compiled``, or None."""
    x, target = args["input"], args["target"]
    if args.get("weight") is not None:
        return "class weights"
    if args.get("size_average") is not None or args.get("reduce") is not None:
        return "the deprecated size_average/reduce arguments"
    if is_dtensor(x):
        return "logits split over the vocabulary (loss parallelism)"
    if not isinstance(x, Tensor) or not isinstance(target, Tensor) or x.dim() != 2:
        return "inputs other than (N, C) logits"
    if target.is_floating_point():
        return "class-probability targets"
    if args.get("reduction", "mean") not in REDUCTIONS:
        return f"reduction {args.get('reduction')!r}"
    return None


def is_dtensor(t: Any) -> bool:
    """Whether ``t`` is a DTensor (False where this torch has no torch.distributed)."""
    if not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def traced_cross_entropy(*args: Any, **kwargs: Any) -> Tensor:
    """``F.cross_entropy`` inside a compiled loss: the fused op, or eager where inductor's
    graph would differ from it (the reason becomes an assumption of the trace)."""
    _CALLS[0] += 1
    bound = dict(zip(CROSS_ENTROPY_PARAMS, args, strict=False)) | kwargs
    why = unfusable(bound)
    if why is not None:
        assume(f"--loss compiled: a cross_entropy with {why} is traced eagerly (not fused)")
        return F.cross_entropy(*args, **kwargs)
    loss, *_ = torch.ops.nnperf.cross_entropy(
        bound["input"], bound["target"], int(bound.get("ignore_index", -100)),
        str(bound.get("reduction", "mean")), float(bound.get("label_smoothing", 0.0)))
    return loss


def in_compiled_loss() -> bool:
    """Whether ``F.cross_entropy`` is called by a compiled loss under a trace."""
    return _TRACING[0] > 0 and _IN_COMPILED_LOSS[0] > 0


@contextlib.contextmanager
def tracing() -> Iterator[None]:
    """A trace under way: compiled losses run as the fused ops instead of ``torch.compile``."""
    _TRACING[0] += 1
    try:
        yield
    finally:
        _TRACING[0] -= 1


class CompiledLoss:
    """``torch.compile(loss_fn)``: compiled on a device, the fused ops under a trace."""

    def __init__(self, loss_fn: Callable[[Any], Tensor]) -> None:
        self.loss_fn = loss_fn
        self._compiled: Callable[[Any], Tensor] | None = None

    def __call__(self, output: Any) -> Tensor:
        if not _TRACING[0]:
            if self._compiled is None:
                self._compiled = torch.compile(self.loss_fn)
            return self._compiled(output)
        calls = _CALLS[0]
        _IN_COMPILED_LOSS[0] += 1
        try:
            loss = self.loss_fn(output)
        finally:
            _IN_COMPILED_LOSS[0] -= 1
        if _CALLS[0] == calls:
            raise UsageError(NO_CROSS_ENTROPY)
        return loss

    def __repr__(self) -> str:
        return f"torch.compile({self.loss_fn!r})"


#: ``aten.nll_loss_forward``'s reduction argument for "sum" (``at::Reduction::Sum``).
_SUM = 2


def _eager_chunk(logits: Tensor, target: Tensor, scale: Tensor, ignore_index: int) -> tuple[Tensor, Tensor]:
    """One chunk's loss and logits' gradient with the kernels eager autograd runs for torchtitan's
    ``cross_entropy_loss`` (``F.cross_entropy(pred.float(), labels, reduction="sum")``): the fp32
    copy, log-softmax (its output kept for backward, the copy freed), NLL; then NLL's backward (a
    zero-filled fp32 gradient), log-softmax's backward, the cast back to the logits' dtype."""
    x = logits.float()
    log_probs = torch.ops.aten._log_softmax(x, 1, False)
    del x
    loss, total_weight = torch.ops.aten.nll_loss_forward(log_probs, target, None, _SUM, ignore_index)
    grad = torch.ops.aten.nll_loss_backward(scale, log_probs, target, None, _SUM, ignore_index, total_weight)
    grad = torch.ops.aten._log_softmax_backward_data(grad, log_probs, 1, torch.float32)
    del log_probs
    return loss, grad.to(logits.dtype)


@functools.cache
def _compiled_chunk() -> Callable[..., tuple[Tensor, Tensor]]:
    return torch.compile(_eager_chunk)


def _fused_chunk(logits: Tensor, target: Tensor, scale: Tensor, ignore_index: int) -> tuple[Tensor, Tensor]:
    """One chunk's loss and logits' gradient as a compiled inner loss runs them: the fused ops
    under a trace, inductor's own kernels (the eager chunk compiled) on a device."""
    if not _TRACING[0]:
        return _compiled_chunk()(logits, target, scale, ignore_index)
    loss, row_max, log_sum, _, _ = torch.ops.nnperf.cross_entropy(logits, target, ignore_index, "sum", 0.0)
    grad = torch.ops.nnperf.cross_entropy_backward(scale, logits, target, row_max, log_sum, None, ignore_index,
                                                   "sum", 0.0)
    return loss, grad


def _vocab_parallel_chunk(logits: Tensor, target: Tensor, scale: Tensor, ignore_index: int, group: Any,
                          vocab_start: int) -> tuple[Tensor, Tensor]:
    """One chunk's loss and logits' gradient over this rank's slice of the vocabulary, as
    torchtitan's ``_LossParallelCrossEntropy`` runs them (``torchtitan/components/loss.py`` at
    b5bcd76; what its ``cross_entropy_loss`` calls on logits split over the tensor-parallel
    ranks): the fp32 copy, each row's maximum all-reduced, the sum of exponentials all-reduced,
    the log-probabilities kept, the target's log-probability picked on the rank that holds it and
    all-reduced; then its backward at once: a zero-filled gradient with -1 at the targets,
    plus the probabilities, times the upstream gradient, cast back to the logits' dtype."""
    from torch.distributed import _functional_collectives as funcol

    x = logits.float()
    row_max = funcol.all_reduce(torch.amax(x, dim=-1, keepdim=True), "max", group)
    shifted = x - row_max
    del x
    sum_exp = funcol.all_reduce(torch.sum(torch.exp(shifted), dim=-1, keepdim=True), "sum", group)
    log_probs = shifted - torch.log(sum_exp)
    del shifted
    keep = target != ignore_index
    safe = torch.where(keep, target, 0)
    outside = (safe < vocab_start) | (safe >= vocab_start + logits.shape[-1])
    local = safe - vocab_start
    local[outside] = 0
    picked = torch.gather(log_probs, -1, local.unsqueeze(-1))
    picked[outside.unsqueeze(-1)] = 0
    picked = funcol.all_reduce(picked, "sum", group)
    loss = torch.where(keep, -picked.squeeze(-1), 0).sum()
    grad = torch.zeros_like(log_probs)
    grad[torch.arange(local.shape[0], device=local.device), local] = outside.to(grad.dtype) - 1.0
    upstream = torch.where(keep.unsqueeze(-1), scale, 0)
    grad = (grad + torch.exp(log_probs)) * upstream
    del log_probs
    return loss, grad.to(logits.dtype)


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """The output projection and cross entropy chunk by chunk of tokens, each chunk's gradients
    taken at once (torchtitan's ``ChunkedLossWrapper``: ``chunk_loss.backward()`` per chunk, the
    hidden states' gradient accumulated in an fp32 buffer, ``GradAccumulator``): no more than one
    chunk's logits (and its cross entropy's temporaries) ever exist. The kernels are the ones the
    per-chunk backward runs, written out: autograd inside a traced forward would be mistaken for
    the step's backward. A chunk's logits stay referenced until the next chunk's replace them,
    as the loop variable does in torchtitan's loop. With tensor parallelism (``group``) the
    weight is this rank's slice of the vocabulary from ``vocab_start`` and the hidden states'
    gradient a partial sum (``_vocab_parallel_chunk``)."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, target: Tensor, chunks: int, ignore_index: int,
                compiled: bool, group: Any = None, vocab_start: int = 0) -> Tensor:
        count = (target != ignore_index).sum().float()
        scale = 1.0 / count  # the mean's upstream gradient, one value per token
        grad_hidden = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
        grad_weight = torch.zeros(weight.shape, dtype=weight.dtype, device=weight.device)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        chunk_loss = _fused_chunk if compiled else _eager_chunk
        if group is not None:
            chunk_loss = functools.partial(_vocab_parallel_chunk, group=group, vocab_start=vocab_start)
        for h, t, g in zip(hidden.chunk(chunks), target.chunk(chunks), grad_hidden.chunk(chunks), strict=True):
            logits = F.linear(h, weight)
            loss, d_logits = chunk_loss(logits, t, scale, ignore_index)
            g.copy_(d_logits @ weight.to(d_logits.dtype))
            # the weight's gradient cast to its dtype before the sum, as autograd's backward of
            # autocast's cast does (and a CPU's add_ would anyway)
            grad_weight.add_((d_logits.t() @ h.to(d_logits.dtype)).to(grad_weight.dtype))
            total.add_(loss)
            del d_logits
        # held on ctx, not saved: backward hands them on as the only reference, so autograd makes
        # the weight's gradient the parameter's .grad instead of copying it (AccumulateGrad
        # steals a gradient nothing else holds)
        ctx.grads = [grad_hidden, grad_weight]
        ctx.hidden_dtype = hidden.dtype
        return total / count

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        grad_hidden, grad_weight = ctx.grads
        ctx.grads = None
        return (grad_hidden.mul_(grad).to(ctx.hidden_dtype), grad_weight.mul_(grad.to(grad_weight.dtype)),
                None, None, None, None, None, None)


CHUNKED_NEEDS = ("a chunked loss needs a built-in decoder whose loss is next-token cross entropy over an "
                 "untied output projection (llama-7b, mixtral-8x7b, deepseek-v3-16b), without pipeline "
                 "parallelism, and with tensor parallelism its inner cross entropy eager (--loss chunked)")


class ChunkedLoss:
    """torchtitan's chunked loss: the model stops before its output projection, which the loss
    runs chunk by chunk with cross entropy (``_ChunkedLinearCrossEntropy``), eager inside (its
    default) or compiled (``--loss chunked-compiled``: its inner loss compiled)."""

    def __init__(self, loss_fn: Any, model: nn.Module, chunks: int = DEFAULT_CHUNKS, compiled: bool = False) -> None:
        while not hasattr(model, "chunkable_head") and isinstance(getattr(model, "module", None), nn.Module):
            model = model.module  # DDP's wrapper
        head = getattr(model, "chunkable_head", None)
        targets = getattr(loss_fn, "targets", None)
        if head is None or not isinstance(targets, Tensor) or targets.is_floating_point():
            raise UsageError(CHUNKED_NEEDS)
        if targets.numel() % chunks:
            raise UsageError(f"--loss chunked: {targets.numel()} tokens per step do not split into {chunks} "
                             "equal chunks (torchtitan requires it)")
        self.model, self.targets, self.chunks, self.compiled = model, targets, chunks, compiled
        model.skip_head = True  # the model returns the final norm's output

    def __call__(self, hidden: Any) -> Tensor:
        weight = self.model.chunkable_head().weight
        target = self.targets.to(hidden.device).flatten()
        if is_dtensor(weight) or is_dtensor(hidden):
            return self._vocab_parallel(hidden, weight, target)
        return _ChunkedLinearCrossEntropy.apply(hidden.flatten(0, -2), weight, target, self.chunks, -100,
                                                self.compiled)

    def _vocab_parallel(self, hidden: Any, weight: Any, target: Tensor) -> Tensor:
        """With tensor parallelism, as torchtitan's ChunkedLossWrapper composes with it: the
        final norm's output replicated over the tensor-parallel ranks (an all-gather of its
        sequence shards under sequence parallelism), each rank's projection its slice of the
        vocabulary (``ColwiseParallel``), the loss parallel over it; the hidden states'
        gradient, a partial sum on each rank, reduced once after the loop (a reduce-scatter
        back to the sequence shards, or an all-reduce)."""
        from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

        mesh = weight.device_mesh if is_dtensor(weight) else None
        if (self.compiled or mesh is None or mesh.mesh_dim_names != ("tensor",)
                or tuple(weight.placements) != (Shard(0),)):
            raise UsageError("--loss chunked over a sharded output projection is modelled for its vocabulary split "
                             "over tensor-parallel ranks, with an eager inner loss (--loss chunked); here it is "
                             f"{'compiled' if self.compiled else 'sharded otherwise'}")
        if not is_dtensor(hidden):
            hidden = DTensor.from_local(hidden, mesh, [Replicate()], run_check=False)
        local = hidden.redistribute(mesh, [Replicate()]).to_local(grad_placements=[Partial()])
        group = mesh.get_group()
        rows = -(-weight.shape[0] // mesh.size())  # torch.chunk's slice, as ColwiseParallel shards
        start = min(weight.shape[0], rows * torch.distributed.get_rank(group))
        return _ChunkedLinearCrossEntropy.apply(local.flatten(0, -2), weight.to_local(), target, self.chunks, -100,
                                                False, group, start)

    def __repr__(self) -> str:
        inner = ", compiled" if self.compiled else ""
        return f"ChunkedLoss(targets={tuple(self.targets.shape)}, chunks={self.chunks}{inner})"


def loss_for(loss_fn: Callable[[Any], Tensor], mode: str, model: nn.Module | None = None) -> Callable[[Any], Tensor]:
    """The loss function a step with ``TraceOptions.loss == mode`` runs (``model``: the one
    whose output projection a chunked loss takes over)."""
    if mode == "compiled":
        return CompiledLoss(loss_fn)
    if mode in CHUNKED_LOSSES:
        if model is None:
            raise UsageError(CHUNKED_NEEDS)
        return ChunkedLoss(loss_fn, model, compiled=mode == "chunked-compiled")
    return loss_fn
