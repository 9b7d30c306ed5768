"""The cost registry names only operators the running torch has, and says so at import."""

from __future__ import annotations

import pytest
import torch

from nnperf.passes.costs import registered_names
from nnperf.passes.costs.registry import register


def _is_torch_op(name: str) -> bool:
    """Walk ``torch.ops`` by hand (not through the registry's own resolver)."""
    namespace, op, *overload = name.split(".")
    packet = getattr(getattr(torch.ops, namespace), op, None)
    if packet is None:
        return False
    return not overload or overload[0] in packet.overloads()


def test_every_registered_name_is_an_operator_of_this_torch():
    names = registered_names()
    assert len(names) > 250  # the whole table, not an empty registry
    assert [n for n in names if not _is_torch_op(n)] == []


@pytest.mark.parametrize(
    "name",
    # not aten ops in any torch nnperf supports: to(dtype) runs as _to_copy, chunk as split,
    # as_strided's backward is a C++ helper of autograd, l1_loss_backward left in torch 1.13
    ["aten._to_dtype", "aten.chunk_copy", "aten.as_strided_backward", "aten.l1_loss_backward"],
)
def test_names_that_were_not_operators_are_gone(name):
    assert not _is_torch_op(name)
    assert name not in registered_names()


def test_a_name_torch_lacks_fails_registration():
    with pytest.raises(RuntimeError, match=r"aten\.no_such_op"):
        register("aten.mm_typo", "aten.no_such_op")(lambda e: None)
    with pytest.raises(RuntimeError, match=r"aten\.no_such_op"):
        register("aten.no_such_op", since="2.4")(lambda e: None)  # expected by now: a bug


def test_an_op_of_a_newer_torch_is_skipped_on_an_older_one():
    fn = register("aten.no_such_op", since="99.0")(lambda e: None)
    assert fn is not None
    assert "aten.no_such_op" not in registered_names()


def test_ops_of_newer_torch_versions_are_registered_where_they_exist():
    for name in ("aten._safe_softmax", "aten._fused_rms_norm", "aten._fused_rms_norm_backward"):
        assert (name in registered_names()) == _is_torch_op(name)


def test_ops_registered_for_an_import_exist_once_it_is_done():
    """Formulas registered without a presence check (``register_defined_on_import``) name
    ops that the module defines: import it and resolve every name."""
    import importlib

    from nnperf.passes.costs.registry import DEFINED_ON_IMPORT, resolve_op

    assert DEFINED_ON_IMPORT  # FSDP2's fsdp:: copy ops
    for module, names in DEFINED_ON_IMPORT.items():
        importlib.import_module(module)
        assert [n for n in names if resolve_op(n) is None] == [], module


def test_importing_nnperf_does_not_import_fsdp():
    import subprocess
    import sys

    code = "import sys, nnperf.cli.app; print('torch.distributed.fsdp' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
