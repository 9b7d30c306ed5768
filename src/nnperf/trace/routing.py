"""Mixture-of-experts routing on fake tensors: an explicit assumption instead of a failure.

Which expert a token goes to is decided by values (the router's top-k), and what follows
depends on it: how many rows each expert's GEMM gets (``aten._grouped_mm``'s offsets from
``aten.histc``: transformers 5, torchtitan), or, in code that loops over experts
(transformers 4's Mixtral), the shapes themselves (``nonzero``, ``torch.where(mask)``). A
fake trace has no values, so the tracer gives the router's choice assumed values:

- the indices ``torch.topk`` returns on a fake input become a constant
  (``FakeTensor.constant``): by default every expert gets the same share of the routed
  (token, slot) pairs, or the shares the user gives (``TraceOptions.moe_load``), or the
  load a capacity factor describes (``moe_capacity_factor``: the busiest expert gets that
  factor times the mean, the others share the rest evenly);
- the trace's fake mode keeps constants up to ``ROUTING_CONSTANT_LIMIT`` elements (PyTorch's
  keeps one), so what is computed from them (one-hot masks, sorts, histograms, cumulative
  sums, ``nonzero``) keeps its values and data-dependent shapes come out concrete.

Each token gets ``k`` distinct experts. The assumption is stated in the trace's assumptions
(``trace.assumptions``). A router that does not use ``topk`` (a sort, an argmax) is not
assumed for: its data-dependent shapes still fail with the ``--real`` hint.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import CONSTANT_NUMEL_LIMIT, FakeTensor, FakeTensorMode
from torch.utils._python_dispatch import _disable_current_modes

from nnperf.errors import UsageError
from nnperf.trace import flex_attention, limits
from nnperf.trace.assumptions import assume

#: Elements a constant may hold in a trace's fake mode: routing tensors (tokens x top-k x
#: experts one-hot masks) of a large batch, computed for real on the CPU. PyTorch's own
#: limit (``fake_tensor.CONSTANT_NUMEL_LIMIT``) is 1.
ROUTING_CONSTANT_LIMIT = 1 << 26


class TraceFakeMode(FakeTensorMode):
    """The trace's fake tensor mode: constants up to ``ROUTING_CONSTANT_LIMIT`` elements stay
    constants (see the module docstring); fused optimizer updates do nothing, and an op with no
    fake kernel runs for real only on small inputs (``trace.limits``)."""

    _in_view = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._dispatching: list[tuple[Any, Any]] = []  # the arguments of the ops being dispatched

    def _dispatch_impl(self, func, types, args, kwargs):
        if func in limits.FUSED_UPDATES:
            return None  # values only: nothing for a fake tensor to do (and no real kernel run)
        self._dispatching.append((args, kwargs))
        try:
            # A view of a constant stays a view of its input (no new storage and no kernel, as
            # the device runs it); the tracer gives it its values at the call (``shadowed``).
            # Scalars keep PyTorch's own rule (a 0-dim step counter's detach stays a constant).
            if not getattr(func, "is_view", False):
                return super()._dispatch_impl(func, types, args, kwargs)
            self._in_view += 1
            try:
                return super()._dispatch_impl(func, types, args, kwargs)
            finally:
                self._in_view -= 1
        finally:
            self._dispatching.pop()

    def can_run_unsafe_fallback(self, func) -> bool:
        """PyTorch's rule, and the op's inputs within ``limits.FALLBACK_BYTES``: past that the
        fallback would allocate them for real (``limits.check_fallback`` refuses it)."""
        if not super().can_run_unsafe_fallback(func):
            return False
        if self._dispatching:
            limits.check_fallback(func, *self._dispatching[-1])
        return True

    def may_turn_const(self, t: Tensor) -> bool:
        limit = CONSTANT_NUMEL_LIMIT if self._in_view else ROUTING_CONSTANT_LIMIT  # PyTorch's for views
        return (t.numel() <= limit and not t.is_sparse and not self.is_our_fake(t)
                and t.device.type != "meta")


flex_attention.serve_fake_mode(TraceFakeMode)


@dataclass(frozen=True)
class Routing:
    """How routed (token, slot) pairs spread over experts."""

    load: tuple[float, ...] | None = None  # shares per expert (normalized); None: uniform
    capacity_factor: float | None = None

    def shares(self, experts: int) -> list[float]:
        """Each expert's share of the routed pairs."""
        if self.load is not None:
            if len(self.load) != experts:
                raise UsageError(
                    f"--moe-load gives {len(self.load)} shares but the router chooses among "
                    f"{experts} experts; give {experts} comma-separated shares"
                )
            total = sum(self.load)
            return [s / total for s in self.load]
        if self.capacity_factor is not None and experts > 1:
            top = min(1.0, self.capacity_factor / experts)
            rest = (1.0 - top) / (experts - 1)
            return [top] + [rest] * (experts - 1)
        return [1.0 / experts] * experts

    def describe(self, experts: int, k: int) -> str:
        if self.load is not None:
            how = "shares " + ", ".join(f"{s:.3g}" for s in self.shares(experts)) + " (--moe-load)"
        elif self.capacity_factor is not None:
            how = (f"the busiest expert at {self.capacity_factor:g}x the mean load, the others "
                   f"even (--moe-capacity-factor)")
        else:
            how = "uniformly"
        return (f"MoE routing: values unknown to a fake trace; each token's top-{k} of {experts} "
                f"experts are assumed spread {how}")


def assigned_experts(tokens: int, k: int, shares: Sequence[float]) -> list[list[int]]:
    """Expert ids for ``tokens`` x ``k`` slots with the given shares, k distinct per token.

    Counts are the shares of tokens x k rounded (largest remainders), each at most ``tokens``
    (an expert appears once per token); slots are filled column by column from the experts'
    runs, so an expert's run of at most ``tokens`` slots never lands twice on one token."""
    experts = len(shares)
    pairs = tokens * k
    raw = [s * pairs for s in shares]
    counts = [min(tokens, math.floor(r)) for r in raw]
    order = sorted(range(experts), key=lambda e: raw[e] - math.floor(raw[e]), reverse=True)
    i = 0
    while sum(counts) < pairs:  # largest remainders first, then wherever room is left
        e = order[i % experts]
        if counts[e] < tokens:
            counts[e] += 1
        i += 1
    flat = [e for e in range(experts) for _ in range(counts[e])]
    return [[flat[j * tokens + t] for j in range(k)] for t in range(tokens)]


def routed_topk(func, args: tuple, kwargs: dict, routing: Routing):
    """``torch.topk`` whose indices, on a fake input, take the assumed routing's values."""
    out = func(*args, **kwargs)
    x = args[0] if args else kwargs.get("input")
    if not isinstance(x, FakeTensor) or x.constant is not None:
        return out
    names = ("input", "k", "dim", "largest", "sorted")
    bound = dict(zip(names, args, strict=False)) | kwargs
    k, dim = int(bound["k"]), int(bound.get("dim", -1))
    experts = x.shape[dim]
    indices = out.indices
    if k > experts or indices.numel() == 0:
        return out
    rows = indices.numel() // k
    table = assigned_experts(rows, k, routing.shares(experts))
    with _disable_current_modes():
        values = torch.tensor(table, dtype=indices.dtype).reshape(
            *[s for i, s in enumerate(indices.shape) if i != dim % indices.dim()], k
        ).movedim(-1, dim)
    indices.constant = values.contiguous()
    assume(routing.describe(experts, k))
    return out


_TOPK = {torch.topk, Tensor.topk}


def is_topk(func) -> bool:
    return func in _TOPK


def constant_args(args: tuple, kwargs: dict) -> bool:
    """Whether a call's tensor arguments are all constant fakes (at least one): values the
    trace knows (assumed routing, host lengths)."""
    found = False
    for a in (*args, *kwargs.values()):
        if isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, Tensor):
                    if not (isinstance(b, FakeTensor) and b.constant is not None):
                        return False
                    found = True
        elif isinstance(a, Tensor):
            if not (isinstance(a, FakeTensor) and a.constant is not None):
                return False
            found = True
    return found


def shadowed(func, args: tuple, kwargs: dict):
    """Run a call on constant fakes as usual (its ops recorded as the device runs them), run it
    on their values too, and give its tensor results their values: composite functions
    (``one_hot`` builds a ``zeros`` and scatters into it) would otherwise lose them at their
    first factory, and views (``permute``, indexing) at once."""
    inputs = [a for a in _flat(args, kwargs) if isinstance(a, FakeTensor)]
    # An in-place call updates the values as it does the fakes, once: on copies, for the fake
    # mode may update a constant itself (a 0-dim step counter's ``_foreach_add_``).
    in_place = getattr(func, "__name__", "").endswith("_") or "out" in kwargs
    with _disable_current_modes():
        values = [a.constant.clone() if in_place else a.constant for a in inputs]
    by_id = {id(a): v for a, v in zip(inputs, values, strict=True)}
    real_args = tuple(_constant(a, by_id) for a in args)
    real_kwargs = {k: _constant(v, by_id) for k, v in kwargs.items()}
    out = func(*args, **kwargs)
    with _disable_current_modes():
        real = func(*real_args, **real_kwargs)
    # the fake mode drops the constants of inputs a result aliases (it cannot follow writes
    # through a view); the values above followed them
    for fake, value in zip(inputs, values, strict=True):
        if fake.constant is None:
            fake.constant = value
    if isinstance(out, Iterator):  # Tensor.__iter__: the rows, each with its values
        rows = list(out)
        _attach(rows, list(real))
        return iter(rows)
    _attach(_tensors(out), _tensors(real))
    return out


def _flat(args: tuple, kwargs: dict) -> list:
    flat = []
    for a in (*args, *kwargs.values()):
        flat.extend(a if isinstance(a, (list, tuple)) else [a])
    return flat


def _attach(fakes: list, values: list) -> None:
    for fake, value in zip(fakes, values, strict=False):
        if (isinstance(fake, FakeTensor) and fake.constant is None and isinstance(value, Tensor)
                and fake.shape == value.shape and fake.dtype == value.dtype
                and value.numel() <= ROUTING_CONSTANT_LIMIT):
            fake.constant = value


def _constant(a, values: dict[int, Tensor]):
    if isinstance(a, FakeTensor):
        return values[id(a)]
    if isinstance(a, (list, tuple)):
        return type(a)(_constant(b, values) for b in a)
    return a


def _tensors(out) -> list:
    if isinstance(out, Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for t in out if isinstance(t, Tensor)]
    return []
