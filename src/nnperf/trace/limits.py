"""What one trace may cost on this machine: modules built, ops recorded, real memory touched.

A trace promises to use no memory for the model's tensors (meta or fake tensors) and to stay
small on the host. Three things can break that promise, each bounded here and refused in one
line that names the limit instead of exhausting the machine:

- **Sizes with no upper bound**: ``-O n_layer=1e30``, a config with ``num_hidden_layers:
  1000000000``. Every layer (and every expert) builds at least one module, so a count above
  ``max_modules()`` is refused before anything is built (``check_counts``), and a build that
  registers more modules than that is stopped where it crosses the line (``bounded_build``).
- **Traces that outgrow the host**: the recorder stops at ``max_traced_ops()`` ops.
- **Ops with no fake kernel**: PyTorch's fake tensor mode runs such an op's real CPU kernel on
  zero-filled tensors of its inputs' sizes ("fallback kernels"). ``aten._fused_sgd_`` has none:
  ``--optimizer sgd --optimizer-impl fused`` allocated every parameter, gradient and momentum
  buffer for real (12.9 GB of host memory for gpt2-xl). The fused optimizers' in-place updates
  change values only, so a fake trace skips them (``FUSED_UPDATES``); any other such op may
  run for real on at most ``FALLBACK_BYTES`` of inputs and is refused above that.

The budget: a quarter of this machine's physical memory per trace (``fit`` and ``advise`` run
several traces at once, one per worker process). The costs per module and per op were measured
on a 2-core VM (torch 2.13.0+cpu) by ``benchmarks/trace_host_memory.py``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from nnperf.errors import UsageError
from nnperf.request import INDEX_MAX

#: Host memory per traced op, through the analysis passes: the slope of peak RSS over ops
#: recorded, ``nnperf analyze gpt2 -O n_embd=64`` at 200 and 800 blocks (7.7 KB per op;
#: ``benchmarks/trace_host_memory.py``).
BYTES_PER_TRACED_OP = 8 * 1024
#: Host memory per module built and traced: 2.9 KB to build a module on the meta device, plus
#: its ops (a gpt2 block: 5.2 traced ops per module at ``BYTES_PER_TRACED_OP``), 45 KiB in all
#: (``benchmarks/trace_host_memory.py``).
BYTES_PER_MODULE = 45 * 1024
#: The share of the host's memory one trace may take (see the module docstring).
HOST_SHARE = 0.25
#: Real bytes an op with no fake kernel may run on (its inputs, as zeros): small lookups and
#: helpers, never a model's weights or activations.
FALLBACK_BYTES = 64 * 2**20
#: The fused updates of the optimizers a step builds (``--optimizer``, ``trace.step``): in-place
#: updates of the parameters and their state, which change values and never a shape, so a fake
#: trace has nothing to run for them. PyTorch (2.13, 2.14) has no fake kernel for
#: ``_fused_sgd_`` and the ``tensor_lr`` overloads.
FUSED_UPDATES = frozenset(
    getattr(getattr(torch.ops.aten, name), overload)
    for name in ("_fused_sgd_", "_fused_adam_", "_fused_adamw_")
    if hasattr(torch.ops.aten, name)
    for overload in getattr(torch.ops.aten, name).overloads()
)
#: Config fields that count layers or experts: each adds at least one module.
_COUNT_FIELD = re.compile(r"(^|_)(n_?)?layers?$|(^|_)experts$")


@functools.cache
def host_memory_bytes() -> int:
    """This machine's physical memory (16 GiB where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return 16 * 2**30


def budget_bytes() -> int:
    return int(host_memory_bytes() * HOST_SHARE)


def max_modules() -> int:
    """The most modules one trace may build on this machine."""
    return budget_bytes() // BYTES_PER_MODULE


def max_traced_ops() -> int:
    """The most ops one trace may record on this machine."""
    return budget_bytes() // BYTES_PER_TRACED_OP


def _budget_text(per: int, what: str) -> str:
    return (f"a quarter of this machine's {host_memory_bytes() / 2**30:.1f} GiB host memory at "
            f"~{per // 1024} KiB per {what}")


def check_counts(fields: Mapping[str, Any], where: str) -> None:
    """Refuse a layer or expert count (``fields``: a config, or ``-O`` overrides; nested
    configs searched too) that would build more modules than one trace may hold here, and an
    integer size above 2**31 - 1 (``request.INDEX_MAX``, the bound of every size the CLI takes)."""
    for key, value in _integer_fields(fields):
        if value > INDEX_MAX:
            raise UsageError(f"{where}: {key}={_shown_number(value)} is too large; every size is at most "
                             f"2**31 - 1 = {INDEX_MAX:,}")
    limit = max_modules()
    for key, value in _count_fields(fields):
        number = _as_number(value)
        if number is not None and number > limit:
            raise UsageError(
                f"{where}: {key}={_shown_number(number)} is more than this machine can trace: each one builds "
                f"at least one module, and a trace holds at most {limit:,} modules here "
                f"({_budget_text(BYTES_PER_MODULE, 'module built and traced')}); give a smaller {key}")


def _count_fields(fields: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    for key, value in fields.items():
        if isinstance(value, Mapping):
            yield from _count_fields(value)
        elif isinstance(key, str) and _COUNT_FIELD.search(key):
            yield key, value


def _integer_fields(fields: Mapping[str, Any]) -> Iterator[tuple[str, float]]:
    """Every integer field (an int, or text that reads as a whole number), nested configs too."""
    for key, value in fields.items():
        if isinstance(value, Mapping):
            yield from _integer_fields(value)
            continue
        number = _as_number(value)
        if number is not None and (isinstance(value, int) or (isinstance(value, str) and float(number).is_integer())):
            yield str(key), number


def _as_number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return value
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _shown_number(number: float) -> str:
    """1,000,000,000 for a whole number a reader can count, else 1e+30."""
    if abs(number) < 1e18 and float(number).is_integer():
        return f"{int(number):,}"
    return f"{float(number):g}"


class TooManyModules(UsageError):
    """A build registered more modules than one trace may hold here."""


@contextlib.contextmanager
def bounded_build(what: str) -> Iterator[None]:
    """Build a model counting the modules it registers; past ``max_modules()`` the build
    stops with a ``TooManyModules`` naming ``what`` and the limit."""
    from torch.nn.modules.module import register_module_module_registration_hook

    limit = max_modules()
    count = [0]

    def counted(module: torch.nn.Module, name: str, submodule: Any) -> None:
        if submodule is None:
            return
        count[0] += 1
        if count[0] > limit:
            raise TooManyModules(
                f"{what} builds more than {limit:,} modules, more than this machine can trace "
                f"({_budget_text(BYTES_PER_MODULE, 'module built and traced')}); give fewer layers "
                "or experts (-O)")

    handle = register_module_module_registration_hook(counted)
    try:
        yield
    finally:
        handle.remove()


def too_many_ops(limit: int) -> UsageError:
    return UsageError(
        f"the step records more than {limit:,} ops, more than this machine can trace "
        f"({_budget_text(BYTES_PER_TRACED_OP, 'traced op')}); trace fewer layers (-O), a shorter "
        "sequence or fewer micro-batches")


def check_fallback(func: Any, args: Any, kwargs: Any) -> None:
    """An op with no fake kernel is about to run for real on zeros of its inputs' sizes:
    refuse it when those inputs exceed ``FALLBACK_BYTES``."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._pytree import tree_leaves

    real = sum(t.numel() * t.element_size() for t in tree_leaves((args, kwargs)) if isinstance(t, FakeTensor))
    if real > FALLBACK_BYTES:
        raise UsageError(
            f"{func} has no fake-tensor kernel in torch {torch.__version__}: tracing it would run it for real "
            f"on {real / 2**20:,.0f} MiB of zeros (a trace allows {FALLBACK_BYTES // 2**20} MiB); give it "
            "a fake kernel (torch.library.register_fake) or trace a smaller configuration")
