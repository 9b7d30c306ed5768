"""Megatron-LM's embedding split over the vocabulary, for Megatron-LM's layouts.

Why it is not PyTorch's: ``RowwiseParallel`` on ``nn.Embedding`` (torchtitan's plan) runs
DTensor's embedding, whose forward looks the rank's rows up as Megatron does, but whose backward
has no strategy that keeps the weight's gradient split by rows
(torch/distributed/tensor/_ops/_embedding_ops.py, ``embedding_dense_backward_strategy``: the
gradient sharded by columns, or ``Partial``): each rank computes the gradient of the whole
table and keeps its slice. For Nemotron-4 340B on 8 tensor-parallel ranks (256,000 tokens x
18,432) that is an 8.8 GiB transient where Megatron-LM has the rank's 1.1 GiB.

Megatron-Core's ``VocabParallelEmbedding.forward`` (megatron/core/tensor_parallel/layers.py)
works on the rank's rows alone: the token ids outside ``[start, end)`` are masked, the others
shifted by ``start``, the lookup runs on the local table, the masked rows of its output are
zeroed, and the partial sums are all-reduced (reduce-scattered along the sequence under
sequence parallelism). Its backward is ``F.embedding``'s on the local table.

``MegatronEmbedding`` is a ``TorchFunctionMode`` that runs this for every ``F.embedding`` of
ids over a table split by rows (a ``DTensor`` sharded on dimension 0 of a 1-D mesh) with no
padding index, norm or sparse gradient; any other call runs as written. Its result is the
``Partial`` ``DTensor`` DTensor's own embedding returns, so the layout's output style does the
reduction, the same collective as before.
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

from nnperf.trace.loss import is_dtensor
from nnperf.trace.parallel.tensor import shard_start

#: ``F.embedding``'s parameters, in order (for calls made positionally).
EMBEDDING_PARAMS = ("input", "weight", "padding_idx", "max_norm", "norm_type", "scale_grad_by_freq", "sparse")


def vocab_parallel_embedding(ids: Any, weight: Any) -> Any:
    """``F.embedding(ids, weight)`` of a table split by rows over a 1-D mesh, as Megatron-Core
    computes it (module docstring): a ``Partial`` DTensor."""
    from torch.distributed.tensor import DTensor, Partial

    mesh = weight.device_mesh
    local = weight.to_local()
    start = shard_start(weight.shape[0], mesh)
    if is_dtensor(ids):
        ids = ids.full_tensor()
    outside = (ids < start) | (ids >= start + local.shape[0])
    local_ids = (ids - start).masked_fill_(outside, 0)
    output: Tensor = F.embedding(local_ids, local)
    output.masked_fill_(outside.unsqueeze(-1), 0.0)
    return DTensor.from_local(output, mesh, [Partial()], run_check=False)


class MegatronEmbedding(TorchFunctionMode):
    """Runs ``F.embedding`` over a table split by rows as Megatron-Core does (module docstring);
    any other call as written."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.embedding:
            bound = dict(zip(EMBEDDING_PARAMS, args, strict=False)) | kwargs
            if _megatron_applies(bound):
                return vocab_parallel_embedding(bound["input"], bound["weight"])
        return func(*args, **kwargs)


def _megatron_applies(bound: dict[str, Any]) -> bool:
    """Whether Megatron's function computes this call: a table sharded by rows over one mesh
    dimension, integer ids, none of the options VocabParallelEmbedding leaves out."""
    from torch.distributed.tensor import Shard

    weight, ids = bound["weight"], bound["input"]
    if not is_dtensor(weight) or weight.dim() != 2 or weight.device_mesh.ndim != 1:
        return False
    if weight.placements != (Shard(0),) or ids.is_floating_point():
        return False
    if is_dtensor(ids) and (ids.device_mesh != weight.device_mesh or not all(p.is_replicate() for p in ids.placements)):
        return False
    return (bound.get("padding_idx") is None and bound.get("max_norm") is None
            and not bound.get("scale_grad_by_freq") and not bound.get("sparse"))
