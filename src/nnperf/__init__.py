"""nnperf: how fast and how big a PyTorch network will be on a GPU, and why.

``analyze`` traces one step and counts it; ``predict`` adds time on a GPU; ``register_cost``
gives a user's own operator a cost formula (an ``OpCost`` of a ``Category``). All are imported
on first use (PEP 562 ``__getattr__``) so ``import nnperf`` stays cheap for the CLI, and what
that returns is the real function, so ``help(nnperf.predict)`` and tab completion show its
signature and documentation.
"""

__version__ = "0.1.0"
__all__ = ["Category", "OpCost", "advise", "analyze", "predict", "register_cost"]

#: Public name -> the module that defines it.
_LAZY = {
    "analyze": "nnperf.analysis",
    "predict": "nnperf.prediction",
    "advise": "nnperf.search.advise",  # what to change, each change predicted
    "register_cost": "nnperf.passes.costs",  # a cost formula for a user's own operator
    "OpCost": "nnperf.passes.costs",
    "Category": "nnperf.passes.costs",
}


def __getattr__(name: str) -> object:
    """Import ``analyze`` or ``predict`` on first access and keep it as a module attribute."""
    if name not in _LAZY:
        raise AttributeError(f"module 'nnperf' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public names (what tab completion offers): the lazy functions, the version and
    the submodules imported so far, not the helpers of this module."""
    public = {n for n in globals() if not n.startswith("_")}
    return sorted(public | {*__all__, "__version__"})
