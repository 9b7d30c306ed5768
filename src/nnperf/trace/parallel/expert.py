"""Expert parallelism: each rank of an expert group holds ``experts / ep`` of every MoE layer's
experts, and tokens travel to their experts' rank and back by all-to-all.

PyTorch ships no expert-parallel engine; this is torchtitan's (``ExpertParallel`` in
torchtitan/distributed/expert_parallel.py), on the same PyTorch pieces, for the zoo's
``GroupedExperts`` (``zoo.moe``):

- the experts' weights become DTensors sharded on their expert dimension (``Shard(0)``) over
  the expert group (``distribute_module`` with a partition function);
- dispatch, before the experts: an all-to-all of the per-expert token counts, the send and
  receive splits read on the host (a device-to-host synchronization in a real run), an
  all-to-all of the routed rows (``all_to_all_single_autograd``: its backward is the reverse
  all-to-all), and a gather that regroups the received rows by local expert;
- combine, after the experts: the inverse regrouping and the reverse all-to-all.

FSDP2 then shards the experts' local weights over the data-parallel ranks outside the expert
group (torchtitan's ``dp_shard_mod_ep`` mesh), and every other parameter over all of them.

What a fake trace cannot know, it assumes, and says so: how many rows a rank receives for
its experts. Every rank routes its tokens as this one does (``trace.routing``'s assumed
spread), so a rank receives, from each of the ``ep`` ranks, the rows this one sends to its
experts. With the busiest-expert assumption (``--moe-capacity-factor``) rank 0 holds the
busiest expert: the traced rank is the slowest, as the step waits for it.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from nnperf.errors import UsageError
from nnperf.layout import Execution
from nnperf.trace.assumptions import assume


def apply_expert_parallel(model: nn.Module, mesh: Any | None) -> None:
    """Shard every ``GroupedExperts`` of ``model`` over ``mesh`` (the expert group; None: no
    expert parallelism) and give it its dispatch and combine, with the all-gather and
    reduce-scatter over the tensor-parallel group of experts split by
    ``expert_tensor.split_moe``."""
    from torch.distributed.tensor import distribute_module

    from nnperf.trace.parallel.expert_tensor import EXPERT_TENSOR_MESH
    from nnperf.zoo.moe import GroupedExperts

    for module in model.modules():
        if isinstance(module, GroupedExperts):
            tensor_mesh = EXPERT_TENSOR_MESH.get(module)
            if mesh is None and tensor_mesh is None:
                continue
            experts = module.w1.shape[0]
            if mesh is not None and experts % mesh.size():
                raise ValueError(f"{experts} experts do not divide over {mesh.size()} ranks")
            style = _Dispatch(mesh, tensor_mesh)
            distribute_module(module, mesh if mesh is not None else tensor_mesh,
                              partition_fn=_partition if mesh is not None else _held,
                              input_fn=style.dispatch, output_fn=style.combine)


def has_experts(model: nn.Module) -> int:
    """The expert count of the model's mixture-of-experts layers (0: none)."""
    from nnperf.zoo.moe import GroupedExperts

    return next((m.w1.shape[0] for m in model.modules() if isinstance(m, GroupedExperts)), 0)


def routing_of(model: nn.Module) -> dict[str, tuple[int, int]]:
    """Each mixture-of-experts layer's (top-k, experts) by its module name: what a token's
    copies are (``kernels.expert_dispatch``)."""
    from nnperf.zoo.moe import MoE

    return {name: (m.top_k, m.experts_count) for name, m in model.named_modules() if isinstance(m, MoE)}


def _partition(name: str, module: nn.Module, mesh: Any) -> None:
    """The experts' weights sharded on their expert dimension over the expert group: of each
    rank's tensor-parallel slice where ``split_moe`` split them (that split stays local)."""
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    for param_name, param in list(module.named_parameters(recurse=False)):
        local = param.to_local() if isinstance(param, DTensor) else param
        module.register_parameter(param_name, nn.Parameter(distribute_tensor(local.detach(), mesh, [Shard(0)])))


def _held(name: str, module: nn.Module, mesh: Any) -> None:
    """Without expert parallelism the split experts' weights stay as ``split_moe`` made them."""


class _Dispatch:
    """One ``GroupedExperts``' token dispatch and combine over the expert group (``expert``,
    None without expert parallelism) and the tensor-parallel group of split experts
    (``tensor``, None without); keeps the splits between the two."""

    def __init__(self, expert: Any | None, tensor: Any | None) -> None:
        self.expert, self.tensor = expert, tensor
        self.send: list[int] = []
        self.receive: list[int] = []
        self.order: Tensor | None = None
        self.rows = 0

    def dispatch(self, module: nn.Module, inputs: tuple, mesh: Any) -> tuple[Tensor, Tensor]:
        from nnperf.trace.parallel.expert_tensor import gather_rows

        routed, per_expert = inputs
        if self.expert is not None:
            routed, grid = self._all_to_all(routed, per_expert)
        else:  # the rows stay: how many each expert got, read on the host for the regrouping
            experts = per_expert.shape[0]
            counts = (_even_splits(routed.shape[0], 1, experts)[2:] if _valueless(per_expert)
                      else _read_on_host(per_expert))
            grid = [counts]
        if self.tensor is not None:
            # every tensor-parallel peer received rows as this rank did (the routing assumed
            # alike on every rank): source-major over (peer, expert-group source)
            routed = gather_rows(routed, self.tensor)
            grid = grid * self.tensor.size()
        local = len(grid[0])
        # received rows: source rank major, local expert minor; the experts want expert major
        self.rows = routed.shape[0]
        with torch.no_grad():
            self.order = _expert_major(grid, routed.device)
        per_local = torch.tensor([sum(row[e] for row in grid) for e in range(local)], dtype=per_expert.dtype,
                                 device=per_expert.device)
        return routed[self.order], per_local

    def _all_to_all(self, routed: Tensor, per_expert: Tensor) -> tuple[Tensor, list[list[int]]]:
        """The rows to their experts' ranks (the counts first, read on the host), and how many
        rows of each local expert came from each rank."""
        from torch.distributed._functional_collectives import (
            all_to_all_single,
            all_to_all_single_autograd,
            wait_tensor,
        )

        mesh = self.expert
        ep, group = mesh.size(), mesh.get_group()
        local = per_expert.shape[0] // ep
        with torch.no_grad():
            with _shapes_only(per_expert):
                received = wait_tensor(all_to_all_single(per_expert, None, None, group=group))
            received = _assume_symmetric(received, per_expert, ep, mesh.get_local_rank())
            if _valueless(per_expert) or _valueless(received):
                splits = _even_splits(routed.shape[0], ep, local)
            else:
                counts = received.view(ep, local)
                splits = _read_on_host(torch.cat([per_expert.view(ep, local).sum(dim=1), counts.sum(dim=1),
                                                  counts.reshape(-1)]))
        self.send, self.receive = splits[:ep], splits[ep:2 * ep]
        grid = [splits[2 * ep + s * local:2 * ep + (s + 1) * local] for s in range(ep)]
        return wait_tensor(all_to_all_single_autograd(routed, self.receive, self.send, group)), grid

    def combine(self, module: nn.Module, output: Tensor, mesh: Any) -> Tensor:
        from torch.distributed._functional_collectives import (
            all_to_all_single_autograd,
            wait_tensor,
        )

        from nnperf.trace.parallel.expert_tensor import reduce_scatter_rows

        restored = output.new_empty((self.rows, *output.shape[1:]))
        restored = restored.index_put((self.order,), output)
        if self.tensor is not None:
            restored = reduce_scatter_rows(restored, self.tensor)
        if self.expert is None:
            return restored
        return wait_tensor(all_to_all_single_autograd(restored, self.send, self.receive, self.expert.get_group()))


@contextlib.contextmanager
def _shapes_only(counts: Tensor) -> Iterator[None]:
    """The token counts' all-to-all on a fake trace, without the values the counts carry: with
    them, the fake tensor runs the collective for real on the fake process group, and c10d files
    a work under a real output the trace never sees waited (under per-op checkpointing, which
    saves the all-to-all, nothing takes it off: "unwaited collective calls" at exit). The
    received counts take their assumed values afterwards (``_assume_symmetric``)."""
    from torch._subclasses.fake_tensor import FakeTensor

    constant = counts.constant if isinstance(counts, FakeTensor) else None
    if constant is not None:
        counts.constant = None
    try:
        yield
    finally:
        if constant is not None:
            counts.constant = constant


def _valueless(t: Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor) and t.constant is None


def _even_splits(rows: int, ep: int, local: int) -> list[int]:
    """Splits for a pass that only needs shapes (a pipeline's stage shapes, unrecorded, where
    the router's choice has no assumed values): the rows spread evenly, as many received as
    sent (the layer's output has as many rows as it sent, whatever the split)."""
    send = [rows // ep + (r < rows % ep) for r in range(ep)]
    grid = [[n // local + (e < n % local) for e in range(local)] for n in send]
    return send + send + [c for row in grid for c in row]


def _read_on_host(t: Tensor) -> list[int]:
    """The splits on the host: one device-to-host copy that waits for the device (torchtitan's
    ``.to("cpu", non_blocking=False)``). A trace records that one read; the values come from
    the trace's constants (``.tolist()`` of a fake dispatches one read per element)."""
    from torch._subclasses.fake_tensor import FakeTensor

    from nnperf.trace.recorder import unrecorded

    if not isinstance(t, FakeTensor):
        return t.tolist()
    t[:1].tolist()
    with unrecorded():
        return t.tolist()


def _expert_major(grid: list[list[int]], device: torch.device) -> Tensor:
    """Row indices that regroup the received rows (``grid[source][expert]`` rows each, source
    major) expert by expert, built on the device from the counts as torchtitan's
    ``generate_permute_indices`` does (without its padding): a Python loop over the rows would
    be host time a real step does not spend."""
    ep, local = len(grid), len(grid[0])
    total = sum(map(sum, grid))
    counts = torch.tensor([c for row in grid for c in row], dtype=torch.int64, device=device)
    starts = torch.cumsum(counts, 0) - counts  # where each (source, expert) run was received
    by_expert = torch.arange(ep * local, device=device).view(ep, local).t().reshape(-1)
    runs, run_starts = counts[by_expert], starts[by_expert]
    placed = torch.cumsum(runs, 0) - runs  # where each run goes, expert major
    shift = torch.repeat_interleave(run_starts - placed, runs, output_size=total)
    return shift + torch.arange(total, device=device)


def _assume_symmetric(received: Tensor, sent: Tensor, ep: int, rank: int) -> Tensor:
    """On a fake trace, give the received counts their assumed values (module docstring); a
    real run keeps what the all-to-all delivered."""
    from torch._subclasses.fake_tensor import FakeTensor

    if not isinstance(received, FakeTensor) or not isinstance(sent, FakeTensor) or sent.constant is None:
        return received
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        mine = sent.constant.view(ep, -1)[rank]
        received.constant = mine.repeat(ep).contiguous()
    assume(f"expert parallelism over {ep} ranks: every rank routes its tokens as the traced one does, so "
           f"a rank receives from each the rows routed to its experts")
    return received


def apply_experts(model: nn.Module, expert: int, mesh: Any | None, experts: int | None = None) -> None:
    """Expert parallelism ``expert`` over ``mesh`` (the expert group; 1 and None: none, the
    dispatch of experts split over the tensor-parallel group only). ``experts``: the whole
    model's expert count where ``model`` shows a pipeline rank's blocks only (a rank holding
    DeepSeek's leading dense blocks alone has none of its own, and nothing to split)."""
    experts = has_experts(model) if experts is None else experts
    if expert > 1 and not experts:
        raise UsageError(f"expert parallelism ({expert}) needs a mixture-of-experts model; this one has no "
                         "experts (zoo: mixtral-8x7b, or llama-7b -O n_experts=N)")
    if expert > 1 and experts % expert:
        valid = [d for d in range(1, experts + 1) if experts % d == 0]
        raise UsageError(f"{experts} experts do not divide over expert parallelism {expert}; "
                         f"valid: {', '.join(map(str, valid))}")
    apply_expert_parallel(model, mesh if expert > 1 else None)


def shard_experts(model: nn.Module, mesh: Any, execution: Execution, amp: str | None) -> None:
    """FSDP2 over each expert group's local weights on the ranks outside the expert group, on
    their hidden dimension where their experts are fewer than those ranks (torchtitan's
    ``apply_fsdp`` with ``dp_mod_ep_mesh``). An expert's gradient sums the tokens of every rank
    of its expert group, so it is divided by all the data-parallel ranks, not only the ones it
    is reduced over (torchtitan's ``set_gradient_divide_factor``)."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard

    from nnperf.trace.parallel.data import mixed_precision
    from nnperf.zoo.moe import GroupedExperts

    policy = mixed_precision(amp)
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


def explicit_prefetch(model: nn.Module, blocks: list[str]) -> None:
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
