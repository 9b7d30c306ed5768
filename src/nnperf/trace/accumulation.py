"""Gradient accumulation inside the autograd engine: in place on a GPU, never on fake tensors.

When two gradients meet at one input of a node (a residual branch, a weight used twice, a
tied embedding), the engine sums them in its input buffer. With real tensors it adds the
second into the first in place when the buffer holds the only reference to the first and the
second is an ordinary tensor (``InputBuffer::accumulate``, torch/csrc/autograd/input_buffer.cpp);
it never does with fake tensors, which count as tensor subclasses there, so a trace shows a
new tensor, as large as the gradient, that a real step does not allocate. For a tied
vocabulary embedding that is a whole extra weight-sized gradient at the peak.

``AccumulationWatch`` tells the recorder which ops are those engine sums (they run after a
node's post-hooks, still under that node); ``fold_inplace_accumulations`` then rewrites the
ones a real step would do in place.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch.utils._pytree import tree_map

from nnperf.trace.events import OpEvent, TensorMeta, Trace

ADD = torch.ops.aten.add.Tensor
_ADD_INPLACE = torch.ops.aten.add_.Tensor


class AccumulationWatch:
    """Post-hooks on autograd nodes mark the moment a node has run and the engine is
    handing its outputs to the next nodes' input buffers, where the sums happen."""

    def __init__(self) -> None:
        self.finished: Any = None  # the node whose outputs are being delivered
        #: ids of the leaf tensors (parameters) a watched backward reaches: their
        #: AccumulateGrad nodes are in the graph
        self.reached: set[int] = set()

    def watch_graph(self, roots: Any) -> None:
        """Hook every node of the backward graph that ``roots`` (tensors) lead to."""
        seen: set[Any] = set()
        pending = [t.grad_fn for t in roots if isinstance(t, torch.Tensor) and t.grad_fn is not None]
        while pending:
            node = pending.pop()
            if node in seen:
                continue
            seen.add(node)
            # AccumulateGrad's own hooks change when it may steal a gradient; leave it alone
            if type(node).__name__ != "AccumulateGrad":
                node.register_hook(self._on_finished)
            else:
                self.reached.add(id(node.variable))
            pending.extend(nxt for nxt, _ in node.next_functions if nxt is not None)

    def _on_finished(self, grad_inputs: Any, grad_outputs: Any) -> None:
        self.finished = torch._C._current_autograd_node()

    def may_sum_in_place(self, func: Any, args: tuple[Any, ...]) -> bool:
        """True when ``func(*args)`` is the engine adding a gradient to one that arrived
        before (the node whose outputs are being delivered is still current) and that one
        is not a view: the engine never reuses a view's memory (a view shares its storage
        with its base), which decides, e.g., that a tied output projection's gradient
        (a transpose) is summed out of place and an autocast copy's in place."""
        if func is not ADD or self.finished is None or torch._C._current_autograd_node() is not self.finished:
            return False
        return isinstance(args[0], torch.Tensor) and not args[0]._is_view()

    def reset(self) -> None:
        self.finished = None


def _dense(meta: TensorMeta) -> bool:
    """Non-overlapping and dense for the shapes gradients have: some permutation of the
    dimensions is contiguous (what ``is_non_overlapping_and_dense`` checks)."""
    dims = sorted((s, n) for s, n in zip(meta.stride, meta.shape, strict=True) if n != 1)
    expected = 1
    for stride, size in dims:
        if stride != expected:
            return False
        expected *= size
    return True


def fold_inplace_accumulations(trace: Trace, engine_sums: set[int]) -> int:
    """Rewrite the engine's out-of-place gradient sums that a real step does in place.

    ``engine_sums`` are the events ``AccumulationWatch.may_sum_in_place`` accepted. Such a sum
    ``old + new`` is done in place (``old.add_(new)``) when ``old``'s storage dies at that op
    (the input buffer held its last reference) and ``old`` is dense with the result's shape
    and dtype. The rewritten event allocates nothing; its result lives in ``old``'s
    storage, and later events that used the result's storage use ``old``'s. Returns how many
    sums were folded.
    """
    renamed: dict[int, int] = {}
    folded = 0
    for e in trace.events:
        if renamed:
            _rename_storages(e, renamed)
        if e.index not in engine_sums or len(e.inputs) < 2 or len(e.outputs) != 1:
            continue
        old, out = e.inputs[0], e.outputs[0]
        new_sid = out.storage
        if (
            old.storage not in e.releases
            or new_sid not in e.allocates
            or old.shape != out.shape
            or old.dtype != out.dtype
            or not _dense(old)
            or trace.storages[old.storage].nbytes != trace.storages[new_sid].nbytes
        ):
            continue
        e.func = _ADD_INPLACE
        e.outputs = [dataclasses.replace(old)]
        e.allocates.remove(new_sid)
        e.releases.remove(old.storage)
        kept, dropped = trace.storages[old.storage], trace.storages.pop(new_sid)
        # the sum is what lives on (a parameter's gradient, say): it keeps its kind and name
        kept.released_after, kept.kind = dropped.released_after, dropped.kind
        kept.name = dropped.name or kept.name
        renamed[new_sid] = old.storage
        folded += 1
    return folded


def _rename_storages(e: OpEvent, renamed: dict[int, int]) -> None:
    metas = (*e.inputs, *e.outputs)
    if not any(m.storage in renamed for m in metas) and not renamed.keys() & {*e.releases, *e.allocates}:
        return

    def rename(value: Any) -> Any:
        if isinstance(value, TensorMeta) and value.storage in renamed:
            return dataclasses.replace(value, storage=renamed[value.storage])
        return value

    e.inputs = [rename(m) for m in e.inputs]
    e.outputs = [rename(m) for m in e.outputs]
    e.args = tree_map(rename, e.args)
    e.kwargs = tree_map(rename, e.kwargs)
    e.releases = [renamed.get(s, s) for s in e.releases]
    e.allocates = [renamed.get(s, s) for s in e.allocates]
