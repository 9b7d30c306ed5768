"""Optimizer kernels: the multi-tensor ``_foreach_*`` family and the fused Adam/AdamW/SGD.

A ``_foreach_`` op applies one elementwise function to every tensor of its lists; FLOPs are
elements x the per-element cost of the underlying op (``_foreach_addcdiv_`` costs what
``addcdiv`` costs). Reads: every tensor of the lists; writes: the lists it updates in place,
or its outputs. Step counters, the 0-dim tensors PyTorch's non-fused optimizers keep on the
host, are HOST ops: their ``_foreach_add_`` then uses the ``.Tensor`` overload with a CPU
scalar, which PyTorch only takes for host-side steps.

Kernel launches (``info["launches"]``): CUDA's ``multi_tensor_apply`` packs the lists into
launches of at most 320 blocks of 65536 elements and, for ``depth`` lists, at most
110/64/48/36/30 tensors (96 with a scalar list at depth 1), the limits of a 4 KB kernel
argument block (ATen ``MultiTensorApply.cuh``). CUDA 13 builds allow larger argument blocks
(770/448/336/252/210 tensors, 2240 blocks) and so fewer launches; the 4 KB limits are the
conservative, widely deployed ones. ``foreach_launches`` replays that packing exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

from nnperf.passes.costs.common import (
    bind,
    distinct,
    is_scalar_bookkeeping,
    listed,
    overload,
    read_args,
)
from nnperf.passes.costs.elementwise import element_flops, host_cost
from nnperf.passes.costs.registry import (
    OPTIMIZER,
    Formula,
    OpCost,
    register,
    register_rule,
    written_args,
)
from nnperf.trace.events import OpEvent, TensorMeta

CHUNK_ELEMENTS = 65536
MAX_BLOCKS = 320
MAX_TENSORS = (110, 64, 48, 36, 30)
MAX_TENSORS_SCALARLIST = (96, 64, 48, 36, 30)

ADAM_FLOPS = 13  # m: 3, v: 4, denominator sqrt(v)/bc2 + eps: 3, p -= lr/bc1 * m/denom: 3
SGD_FLOPS = 2  # p -= lr * g


def foreach_launches(numels: Sequence[int], depth: int, scalar_list: bool = False) -> int:
    """Kernel launches ``multi_tensor_apply`` makes for tensors of these sizes."""
    depth = max(1, min(depth, 5))
    max_tensors = (MAX_TENSORS_SCALARLIST if scalar_list else MAX_TENSORS)[depth - 1]
    launches = tensors_in_launch = blocks_in_launch = 0
    for n in numels:
        if n == 0:
            continue
        tensors_in_launch += 1
        chunks = -(-n // CHUNK_ELEMENTS)
        # whole launches' worth of chunks at a time (an 8B model has ~10^5 chunks per list)
        while chunks > MAX_BLOCKS - blocks_in_launch:  # the launch fills before the last chunk
            chunks -= MAX_BLOCKS - blocks_in_launch
            launches += 1
            blocks_in_launch, tensors_in_launch = 0, 1  # the split tensor carries over
        blocks_in_launch += chunks  # the tensor's last chunk fits in this launch
        if tensors_in_launch == max_tensors or blocks_in_launch == MAX_BLOCKS:
            launches += 1
            blocks_in_launch = tensors_in_launch = 0
    return launches + (1 if blocks_in_launch else 0)


def _tensor_lists(event: OpEvent) -> list[list[TensorMeta]]:
    schema = event.func._schema
    args = bind(event)
    return [
        listed(args[a.name])
        for a in schema.arguments
        if str(a.type).startswith("List[Tensor") and listed(args[a.name])
    ]


def _is_host_step(event: OpEvent) -> bool:
    return is_scalar_bookkeeping(event) and overload(event) == "Tensor"


def foreach_cost(event: OpEvent) -> OpCost:
    if _is_host_step(event):
        return host_cost(event)
    lists = _tensor_lists(event)
    written = written_args(event)
    writes = distinct(written or event.outputs)
    main = lists[0] if lists else []
    elements = sum(t.numel for t in main)
    if event.name == "aten._foreach_norm":
        flops = 2 * elements + len(main)  # squares summed, one sqrt per tensor
    else:
        flops = elements * element_flops(event)
    depth = len(lists) + (0 if written else 1)
    scalar_list = "ScalarList" in overload(event)
    return OpCost(
        OPTIMIZER,
        flops=float(flops),
        reads=read_args(event),
        writes=writes,
        info={
            "tensors": len(main),
            "launches": foreach_launches([t.numel for t in main], depth, scalar_list),
        },
    )


def _foreach_rule(event: OpEvent) -> Formula | None:
    return foreach_cost if event.name.startswith("aten._foreach_") else None


register_rule(_foreach_rule)


@register("aten._fused_adam_", "aten._fused_adamw_", "aten._fused_adam", "aten._fused_adamw")
def _fused_adam(event: OpEvent) -> OpCost:
    """One kernel over params, grads and both moments (and max_exp_avg_sqs for AMSGrad).

    Weight decay adds 1 FLOP per element for AdamW (decoupled p *= 1 - lr wd), 2 for Adam
    (g += wd p); AMSGrad a max; a grad scale a divide. Grads are read, not written back.
    """
    args = bind(event)
    params, grads = listed(args["self"]), listed(args["grads"])
    moments = listed(args["exp_avgs"]) + listed(args["exp_avg_sqs"])
    amsgrad = bool(args.get("amsgrad"))
    maxes = listed(args["max_exp_avg_sqs"]) if amsgrad else []
    per = ADAM_FLOPS + int(amsgrad) + int(args.get("grad_scale") is not None)
    if args.get("weight_decay"):
        per += 1 if "adamw" in event.name else 2
    scalars = [t for k in ("grad_scale", "found_inf", "lr") for t in listed(args.get(k))] + listed(
        args["state_steps"]
    )
    elements = sum(t.numel for t in params)
    depth = 4 + int(amsgrad)
    return OpCost(
        OPTIMIZER,
        flops=float(per * elements),
        reads=distinct(params + grads + moments + maxes + scalars),
        writes=distinct(params + moments + maxes),
        info={
            "tensors": len(params),
            "launches": foreach_launches([t.numel for t in params], depth),
            "fused": True,
        },
    )


@register("aten._fused_sgd_", "aten._fused_sgd")
def _fused_sgd(event: OpEvent) -> OpCost:
    """p -= lr * g (2), + weight decay (2), + momentum buf = m buf + (1-d) g (3), + Nesterov (2).

    The momentum buffers are not read on the first step (they are initialised from g).
    """
    args = bind(event)
    params, grads = listed(args["self"]), listed(args["grads"])
    momentum = bool(args.get("momentum"))
    bufs = listed(args["momentum_buffer_list"]) if momentum else []
    per = SGD_FLOPS + (2 if args.get("weight_decay") else 0)
    if momentum:
        per += 3 + (2 if args.get("nesterov") else 0)
    per += int(args.get("grad_scale") is not None)
    read_bufs = [] if args.get("is_first_step") else bufs
    scalars = [t for k in ("grad_scale", "found_inf", "lr") for t in listed(args.get(k))]
    elements = sum(t.numel for t in params)
    return OpCost(
        OPTIMIZER,
        flops=float(per * elements),
        reads=distinct(params + grads + read_bufs + scalars),
        writes=distinct(params + bufs),
        info={
            "tensors": len(params),
            "launches": foreach_launches([t.numel for t in params], 3 if momentum else 2),
            "fused": True,
        },
    )
