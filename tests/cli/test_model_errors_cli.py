"""A model that fails on the inputs it was given: one line naming the module and the aten op,
exit 4 (a TraceError from Python), without the fake-tensor logger's tracebacks."""

from __future__ import annotations

import logging
import textwrap

import pytest
import torch
from click.testing import CliRunner

import nnperf
from nnperf.cli.app import cli
from nnperf.errors import NnperfError, TraceError

MODEL = textwrap.dedent('''
    import torch
    from torch import nn


    class Net(nn.Module):
        """An MLP whose first Linear takes 64 features."""

        def __init__(self):
            super().__init__()
            self.layers = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))

        def forward(self, x):
            return self.layers(x)


    class Picky(nn.Module):
        """Raises from its own Python code, not from an aten op."""

        def forward(self, x):
            if x.shape[-1] != 64:
                raise ValueError(f"Picky wants 64 features, got {x.shape[-1]}")
            return x


    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.picky = Picky()
            self.fc = nn.Linear(64, 2)

        def forward(self, x):
            return self.fc(self.picky(x))
''')


@pytest.fixture()
def model_file(tmp_path):
    path = tmp_path / "mymodel.py"
    path.write_text(MODEL)
    return path


def run(*args: str):
    result = CliRunner().invoke(cli, ["analyze", *args])
    return result, result.output


def _one_error_line(out: str) -> str:
    assert "Traceback" not in out and "fake_tensor.py" not in out, out
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1, out
    return lines[0]


@pytest.mark.parametrize("real", [False, True])
def test_shape_mismatch_names_module_and_op_and_exits_4(model_file, real):
    flags = ["--real"] if real else []
    result, out = run(f"{model_file}:Net", "--input-shape", "8,65", *flags)
    assert result.exit_code == 4, out
    line = _one_error_line(out)
    assert "in module 'layers.0' (Linear)" in line
    assert "op aten.addmm" in line  # the op the Linear ran
    assert "[8, 65]" in line or "8x65" in line  # PyTorch's own reason
    assert "--input-shape" in line and "in_features=64" in line and "fp32[8, 65]" in line


def test_tokens_on_a_model_that_takes_features_exits_4(model_file):
    result, out = run(f"{model_file}:Net", "--tokens", "2,16", "--vocab", "100")
    assert result.exit_code == 4, out
    line = _one_error_line(out)
    assert "layers.0" in line and "int64[2, 16]" in line


def test_an_exception_of_the_models_own_code_names_the_module(model_file):
    result, out = run(f"{model_file}:Outer", "--input-shape", "8,65")
    assert result.exit_code == 4, out
    line = _one_error_line(out)
    assert "in module 'picky' (Picky)" in line
    assert "ValueError: Picky wants 64 features, got 65" in line
    assert "--real" in line  # fake tensors might be why: the way forward is named
    result, out = run(f"{model_file}:Outer", "--input-shape", "8,65", "--real")
    assert result.exit_code == 4, out
    assert "--real" not in _one_error_line(out)  # already real: no such hint


def test_python_analyze_raises_a_trace_error(model_file):
    import importlib.util

    spec = importlib.util.spec_from_file_location("nnperf_test_mymodel", model_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(TraceError) as info:
        nnperf.analyze(module.Net(), inputs=torch.randn(8, 65))
    assert isinstance(info.value, NnperfError) and info.value.exit_code == 4
    assert "layers.0" in str(info.value) and "aten.addmm" in str(info.value)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_fake_tensor_logger_is_silent_while_tracing_and_restored_after(model_file):
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    handler = _Records()
    logger.addHandler(handler)
    before = logger.level
    try:
        result, _ = run(f"{model_file}:Net", "--input-shape", "8,65")
    finally:
        logger.removeHandler(handler)
    assert result.exit_code == 4
    assert [r for r in handler.records if r.levelno >= logging.ERROR] == []
    assert logger.level == before
