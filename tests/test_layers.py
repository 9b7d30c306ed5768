"""The package's layers: a module imports only from its own layer or lower ones.

Low to high: the package root and errors, formatting units; the multi-GPU layout record;
hardware facts; one-kernel
models; the trace and what it is built from; passes over one trace; the two public results
(and a prediction's track record, beside it);
searches over many traces; measurement; reports; the command line. A lower layer never
imports a higher one, so a pass cannot depend on how it is displayed and a kernel model
cannot depend on a trace. The only exception is the notebook hook: ``_repr_html_`` imports
the HTML renderer lazily.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "nnperf"

LAYERS: list[set[str]] = [
    {"", "errors", "units", "vocab", "special_files", "fields", "progress", "stopping"},
    {"layout"},
    {"hardware"},
    {"kernels"},
    {"workload", "request", "zoo", "trace", "hub"},
    {"loading"},
    {"passes"},
    {"analysis"},
    {"prediction", "accuracy"},
    {"search"},
    {"measure"},
    {"report"},
    {"cli", "__main__"},
]
LAZY_HOOKS = {"_repr_html_"}


def layer_of(module: str) -> int:
    """``nnperf.passes.timing`` -> the index of the layer holding ``passes``."""
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else ""
    for i, members in enumerate(LAYERS):
        if top in members:
            return i
    raise AssertionError(f"{module}: its top-level part {top!r} is in no layer of LAYERS")


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(parts)


def imports(tree: ast.AST):
    """(imported module, enclosing function name or None, line) for every nnperf import."""

    def visit(node: ast.AST, function: str | None):
        for child in ast.iter_child_nodes(node):
            name = function
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = child.name
            if isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                if child.module.startswith("nnperf"):
                    yield child.module, function, child.lineno
            elif isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name.startswith("nnperf"):
                        yield alias.name, function, child.lineno
            yield from visit(child, name)

    yield from visit(tree, None)


def sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_module_is_in_a_layer():
    for path in sources():
        layer_of(module_name(path))


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_import_from_a_higher_layer(path: Path):
    here = module_name(path)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    upward = [
        f"line {line}: {target}"
        for target, function, line in imports(tree)
        if layer_of(target) > layer_of(here) and function not in LAZY_HOOKS
    ]
    assert not upward, f"{here} imports a higher layer: {upward}"


def test_the_check_catches_an_upward_import():
    tree = ast.parse("def f():\n    from nnperf.report.html import analysis_html\n")
    found = [t for t, function, _ in imports(tree) if layer_of(t) > layer_of("nnperf.passes.timing")]
    assert found == ["nnperf.report.html"]
