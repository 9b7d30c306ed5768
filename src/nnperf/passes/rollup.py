"""Roll per-op counts up the module tree, by op name, and into step totals and coverage.

Every group is an ``Estimates`` (the one additive cost record); the grouping helpers
(``group_by_module``, ``group_by_op``) are shared with the prediction, which sums the same
groups of timed ops.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from nnperf.passes.count import OpCount
from nnperf.passes.estimates import Estimates
from nnperf.trace.events import PHASES, Trace


@dataclass
class ModuleRow:
    name: str
    type: str
    depth: int
    params: int
    param_bytes: int
    output_bytes: int
    tally: Estimates

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "depth": self.depth,
            "params": self.params,
            "param_bytes": self.param_bytes,
            "output_bytes": self.output_bytes,
            **self.tally.counts_json(),
            "intensity": self.tally.intensity,
        }


#: The group of ops the root module calls in its own ``forward`` (``F.relu``, ``x.view``,
#: ``log_softmax``), outside any child module. It sits at depth 1 beside the children,
#: ``(loss)`` and ``(optimizer)`` so that the depth-1 rows add up to the step; without it
#: those ops would only be visible inside the inclusive root row.
ROOT_OWN_OPS = "(own ops)"


def depth_of(path: str) -> int:
    return 0 if path == "" else path.count(".") + 1


def ancestors(path: str) -> list[str]:
    """The groups an op of module ``path`` is counted in: the path and all its ancestors up
    to the root ''; an op of the root itself also in ``ROOT_OWN_OPS``, so the groups of
    each depth partition the step."""
    if path == "":
        return ["", ROOT_OWN_OPS]
    parts = path.split(".")
    return ["", *(".".join(parts[: i + 1]) for i in range(len(parts)))]


def module_order(module_types: dict[str, str], names: Iterable[str]) -> list[str]:
    """``names`` in display order: the model's modules in tree order (``named_modules``),
    then the root's own ops, then the groups outside the model ((loss), (optimizer))."""
    wanted = set(names)
    order = [n for n in module_types if n in wanted]
    if ROOT_OWN_OPS in wanted:
        order.append(ROOT_OWN_OPS)
    return order + sorted(wanted - set(order))


def module_type(module_types: dict[str, str], name: str) -> str:
    """The class of a module row; the root's own ops carry the root's class."""
    if name == ROOT_OWN_OPS:
        return module_types.get("", "-")
    return module_types.get(name, name.strip("()") or "-")


def group_by_module(items: Iterable[Any], max_depth: int | None = None) -> dict[str, list[Any]]:
    """Ops (or timed ops: anything with ``.module``) of each module group, inclusive, in
    trace order; only groups down to ``max_depth``."""
    groups: dict[str, list[Any]] = defaultdict(list)
    for item in items:
        for a in ancestors(item.module):
            if max_depth is None or depth_of(a) <= max_depth:
                groups[a].append(item)
    return groups


def group_by_op(items: Iterable[Any]) -> dict[str, list[Any]]:
    """Ops (or timed ops) of each aten op name, in trace order."""
    groups: dict[str, list[Any]] = defaultdict(list)
    for item in items:
        groups[item.op].append(item)
    return groups


def by_module(trace: Trace, ops: list[OpCount], max_depth: int | None = None) -> list[ModuleRow]:
    """Inclusive totals per module (a module counts everything its children do), tree order,
    with the root's own ops as a row of their own (``ROOT_OWN_OPS``)."""
    tallies = {name: Estimates.from_counts(group) for name, group in group_by_module(ops, max_depth).items()}
    params, param_bytes = _params_by_module(trace)
    names = module_order(trace.module_types, [*trace.module_types, *tallies])
    rows = []
    for name in names:
        if max_depth is not None and depth_of(name) > max_depth:
            continue
        rows.append(
            ModuleRow(
                name=name,
                type=module_type(trace.module_types, name),
                depth=depth_of(name),
                params=params.get(name, 0),
                param_bytes=param_bytes.get(name, 0),
                output_bytes=trace.module_output_bytes.get(name, 0),
                tally=tallies.get(name, Estimates()),
            )
        )
    return rows


def _params_by_module(trace: Trace) -> tuple[dict[str, int], dict[str, int]]:
    params: dict[str, int] = defaultdict(int)
    nbytes: dict[str, int] = defaultdict(int)
    for sid, pname in trace.param_storages.items():
        owner = pname.rsplit(".", 1)[0] if "." in pname else ""
        numel = math.prod(trace.param_shapes[pname])
        for a in ancestors(owner):
            params[a] += numel
            nbytes[a] += trace.storages[sid].nbytes
    return params, nbytes


def by_op(ops: list[OpCount]) -> dict[str, Estimates]:
    tallies = {name: Estimates.from_counts(group) for name, group in group_by_op(ops).items()}
    return dict(sorted(tallies.items(), key=lambda kv: -kv[1].flops - kv[1].bytes * 1e-9))


def by_phase(ops: list[OpCount]) -> dict[str, Estimates]:
    groups: dict[str, list[OpCount]] = {p: [] for p in PHASES}
    for op in ops:
        groups[op.phase].append(op)
    return {p: Estimates.from_counts(group) for p, group in groups.items()}


def coverage(ops: list[OpCount]) -> dict[str, Any]:
    """How much of the step has a cost formula, by op count and by bytes touched."""
    uncovered: dict[str, list[float]] = {}
    covered_bytes = total_bytes = 0.0
    for op in ops:
        total_bytes += op.bytes
        if op.covered:
            covered_bytes += op.bytes
        else:
            entry = uncovered.setdefault(op.op, [0, 0.0])
            entry[0] += 1
            entry[1] += op.bytes
    n_uncovered = sum(int(v[0]) for v in uncovered.values())
    return {
        "ops": len(ops),
        "modeled": len(ops) - n_uncovered,
        "op_share": (len(ops) - n_uncovered) / len(ops) if ops else 1.0,
        "byte_share": covered_bytes / total_bytes if total_bytes else 1.0,
        "uncovered": [
            {"op": name, "count": int(c), "bytes": b}
            for name, (c, b) in sorted(uncovered.items(), key=lambda kv: -kv[1][1])
        ],
    }
