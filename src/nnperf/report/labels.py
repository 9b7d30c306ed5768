"""What a reader sees for a module row, the same in every table and report.

The root module's path is '' and its own ops are ``rollup.ROOT_OWN_OPS``; both are shown
with the model's class name, so "(Net)" always means the whole step (inclusive) and
"(Net) own ops" always means the ops the root's ``forward`` calls outside any child, in the
terminal tables, the JSON-fed measure table and the HTML report alike.
"""

from __future__ import annotations

from nnperf.passes.rollup import ROOT_OWN_OPS


def root_label(root_type: str) -> str:
    """'(Net)': the whole step, inclusive of every child, the loss and the optimizer."""
    return f"({root_type})"


def module_label(name: str, root_type: str) -> str:
    """A module path as shown: the root and its own ops by class name, others by path."""
    if name == "":
        return root_label(root_type)
    if name == ROOT_OWN_OPS:
        return f"{root_label(root_type)} own ops"
    return name


def indented(name: str, depth: int, root_type: str) -> str:
    """The label indented two spaces per level below the first (the tree in a table)."""
    return "  " * max(depth - 1, 0) + module_label(name, root_type)
