"""Gradient-norm clipping between backward and the optimizer step (``--clip-grad-norm``).

Nearly every training loop clips: Hugging Face's Trainer (``max_grad_norm = 1.0``), torchtitan
(``max_norm = 1.0``) and Megatron-LM (``--clip-grad 1.0``) do by default. It reads every
gradient once for the norms and reads and writes it once more to scale it, and on sharded
gradients it reduces the norm across ranks. This runs it as torchtitan does
(``torchtitan/distributed/utils.py``, ``clip_grad_norm_``): ``get_total_norm`` (one foreach norm
per gradient, a stack, a vector norm), a DTensor norm made whole with ``full_tensor()`` (an
all-reduce over its mesh), the stages' norms summed over the pipeline group, then
``clip_grads_with_norm_`` (a clamped coefficient, one foreach multiply). Gradients on different
meshes (expert-parallel experts beside the dense layers) get a norm each, combined after,
as torchtitan's ``_clip_grad_norm_with_ep`` does. The coefficient stays on the device: no host
sync.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from nnperf.errors import UsageError

#: The pseudo-module clipping's ops are recorded under.
CLIP_MODULE = "(clip_grad_norm)"
#: Set on a model whose ranks each hold a part of the gradients as plain tensors (ZeRO-1's
#: shares, tensor parallelism's shards under DDP): the process groups the squared norm is
#: summed over (``trace.parallel.data``). The value counts a tensor-parallel rank's replicated
#: parameters once per rank (Megatron-LM's leaves its duplicates out); the work is the same.
NORM_GROUPS = "nnperf_norm_groups"
#: Set on a model whose ranks each hold whole gradients of some parameters and only their own
#: of others (DDP's experts under expert parallelism): an ``ApartNorm``.
APART_NORM = "nnperf_apart_norm"
NORM_TYPE = 2.0
_APART = object()  # the key of the apart parameters' norm


@dataclass(frozen=True)
class ApartNorm:
    """Parameters (``params``: their ids) whose squared norm is summed over ``group`` before it
    joins the others': DDP's experts, each rank of the expert group holding different ones, as
    Megatron-LM's expert optimizer sums its norm over the expert model-parallel group."""

    params: frozenset[int]
    group: Any


def _dtensor_type() -> type | None:
    if not torch.distributed.is_available():
        return None
    from torch.distributed.tensor import DTensor

    return DTensor


def _mesh_key(grad: torch.Tensor, dtensor: type | None) -> Any:
    """Gradients whose norms combine in one ``get_total_norm``: plain tensors, or DTensors of
    one mesh."""
    if dtensor is not None and isinstance(grad, dtensor):
        return grad.device_mesh  # equal meshes hash alike
    return None


@torch.no_grad()
def clip_grad_norm(params: list[torch.Tensor], max_norm: float, pipeline_group: Any = None,
                   reduce_groups: tuple[Any, ...] = (), apart: ApartNorm | None = None) -> torch.Tensor:
    """Scale the gradients of ``params`` so their global 2-norm is at most ``max_norm``; returns
    the norm (a 0-dim device tensor). ``pipeline_group`` and ``reduce_groups``: the ranks whose
    gradients' squared norms are summed with this one's; ``apart``: parameters whose squared
    norm is first summed over a group of its own."""
    from nnperf.trace.diagnosis import quiet_redistribute

    with_grads = [p for p in params if p.grad is not None]
    if not with_grads:
        return torch.zeros(())
    dtensor = _dtensor_type()
    if not hasattr(torch.nn.utils, "get_total_norm"):  # torch < 2.6: its one-call form, plain gradients only
        if (pipeline_group is not None or reduce_groups or apart is not None
                or any(_mesh_key(p.grad, dtensor) is not None for p in with_grads)):
            raise UsageError("--clip-grad-norm on sharded gradients or pipeline stages needs torch >= 2.6 "
                             "(torch.nn.utils.get_total_norm, as torchtitan uses)")
        return torch.nn.utils.clip_grad_norm_(with_grads, max_norm, NORM_TYPE, foreach=True)
    groups: dict[Any, list[torch.Tensor]] = {}
    for p in with_grads:
        key = _APART if apart is not None and id(p) in apart.params else _mesh_key(p.grad, dtensor)
        groups.setdefault(key, []).append(p)
    norms = {}
    for key, members in groups.items():
        with quiet_redistribute():
            norm = torch.nn.utils.get_total_norm([p.grad for p in members], NORM_TYPE, False, True)
            if dtensor is not None and isinstance(norm, dtensor):
                norm = norm.full_tensor()
        norms[key] = norm
    if len(norms) == 1 and pipeline_group is None and not reduce_groups and _APART not in norms:
        total = next(iter(norms.values()))
    else:  # the sum of squares over meshes, the apart parameters' group and pipeline stages
        squares = None
        for key, norm in norms.items():
            square = norm**NORM_TYPE
            if key is _APART:
                torch.distributed.all_reduce(square, op=torch.distributed.ReduceOp.SUM, group=apart.group)
            squares = square if squares is None else squares + square
        for group in (*reduce_groups, *([pipeline_group] if pipeline_group is not None else [])):
            torch.distributed.all_reduce(squares, op=torch.distributed.ReduceOp.SUM, group=group)
        total = squares ** (1.0 / NORM_TYPE)
    for members in groups.values():
        torch.nn.utils.clip_grads_with_norm_(members, max_norm, total, True)
    return total
