"""Loading what the user names: factory files in their three return forms, bare models with
--input-shape or --tokens, and the load errors (exit code 3)."""

from __future__ import annotations

import textwrap
from dataclasses import replace

import pytest

from nnperf.analysis import analyze
from nnperf.errors import ModelLoadError, UsageError, shown
from nnperf.loading import resolve
from nnperf.request import InputSpec, ModelRequest, parse_shape

FACTORIES = '''
import torch
from torch import nn


class LM(nn.Module):
    def __init__(self, vocab=50, dim=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.out = nn.Linear(dim, vocab)

    def forward(self, ids):
        return self.out(self.emb(ids))


def bare():
    return nn.Sequential(nn.Linear(12, 6), nn.ReLU(), nn.Linear(6, 3))


def with_inputs(batch=5):
    return nn.Linear(12, 6), (torch.randn(batch, 12),)


def with_loss():
    model = nn.Linear(12, 6)
    return model, (torch.randn(3, 12),), lambda out: (out ** 2).mean()


def lm():
    return LM()


def raises():
    raise RuntimeError("no GPU for you")


def wrong_type():
    return 42


NOT_CALLABLE = 3
'''


@pytest.fixture()
def factory_file(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(FACTORIES)
    return path


def test_factory_returning_a_bare_model_needs_an_input_shape(factory_file):
    with pytest.raises(UsageError, match="--input-shape"):
        analyze(f"{factory_file}:bare")
    a = analyze(f"{factory_file}:bare", input_spec=InputSpec(shapes=((7, 12),)))
    assert [(g.m, g.n, g.k) for g in a.gemms if g.role == "forward"] == [(7, 6, 12), (7, 3, 6)]
    assert a.config["batch"] == 7
    assert a.totals["params"] == 12 * 6 + 6 + 6 * 3 + 3


def test_factory_returning_model_and_inputs_gets_the_batch(factory_file):
    a = analyze(f"{factory_file}:with_inputs", train=False)
    assert [(g.m, g.n, g.k) for g in a.gemms] == [(5, 6, 12)]
    a = analyze(f"{factory_file}:with_inputs", batch=9, train=False)
    assert [(g.m, g.n, g.k) for g in a.gemms] == [(9, 6, 12)]


def test_factory_returning_model_inputs_and_loss(factory_file):
    a = analyze(f"{factory_file}:with_loss", optimizer="sgd")
    loss_ops = {e.name for e in a.trace.events if e.module == "(loss)"}
    assert "aten.pow" in loss_ops and "aten.mean" in loss_ops  # the factory's loss, not sum
    assert a.config["batch"] == 3


def test_tokens_and_vocab_for_a_bare_language_model(factory_file):
    a = analyze(f"{factory_file}:lm", input_spec=InputSpec(tokens=(2, 7), vocab=50), train=False)
    assert a.config["inputs"] == [{"shape": [2, 7], "dtype": "int64"}]
    assert a.config["tokens"] == 14
    assert [(g.m, g.n, g.k) for g in a.gemms] == [(14, 50, 16)]


@pytest.mark.parametrize(
    "target, fragment",
    [
        ("{dir}/missing.py:f", "does not exist"),
        ("{file}:raises", "RuntimeError: no GPU for you"),
        ("{file}:nothing_here", "no callable named 'nothing_here'"),
        ("{file}:NOT_CALLABLE", "no callable"),
        ("{file}:wrong_type", "not a torch.nn.Module"),
        ("{broken}:f", "SyntaxError"),
        ("no_such_package_xyz.models:f", "ModuleNotFoundError"),
    ],
)
def test_load_errors_name_the_file_and_the_exception(tmp_path, factory_file, target, fragment):
    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n")
    target = target.format(dir=tmp_path, file=factory_file, broken=broken)
    with pytest.raises(ModelLoadError) as info:
        analyze(target)
    assert fragment in str(info.value)
    location = target.rpartition(":")[0]
    # a long path is cut in the middle (errors.shown): pytest-xdist's worker folders make it long
    assert any(name in str(info.value) for name in (location, target, *(shown(n).strip("'") for n in (location, target))))
    assert info.value.exit_code == 3


def test_zoo_model_refuses_input_shapes():
    with pytest.raises(UsageError):
        analyze("mlp", input_spec=InputSpec(shapes=((2, 3),)))


@pytest.mark.parametrize("bad", ["8,x", "", "0,3", "-1", "3,,", "x8", "8,3.5"])
def test_parse_shape_rejects(bad):
    with pytest.raises(UsageError):
        parse_shape(bad)


def test_parse_shape_accepts_x_and_commas():
    assert parse_shape("8x3x224x224") == parse_shape("8, 3,224,224") == (8, 3, 224, 224)
    assert parse_shape(" 7 ") == (7,)


@pytest.mark.parametrize("batch", [0, -1])
def test_invalid_batch(batch):
    with pytest.raises(UsageError):
        analyze("mlp", batch=batch)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"batch": 0}, "invalid batch 0"), ({"seq_len": -2}, "invalid sequence length -2")])
def test_a_request_is_checked_when_made(kwargs, message):
    with pytest.raises(UsageError, match=message):
        ModelRequest("mlp", **kwargs)


def test_one_request_builds_the_same_workload_at_another_batch():
    request = ModelRequest("mlp", batch=2, overrides={"widths": "8,4"})
    _, build = resolve(replace(request, batch=5))
    workload = build()
    assert workload.samples == 5 and request.batch == 2
    assert [m.out_features for m in workload.model.modules() if hasattr(m, "out_features")] == [4]


def test_unknown_model_suggests_close_names():
    with pytest.raises(ModelLoadError, match="resnet50"):
        analyze("resnet-5O")


def test_a_python_file_without_its_factory_says_how_to_name_it():
    with pytest.raises(ModelLoadError, match=r"'my_model\.py' names a Python file: .*'my_model\.py:FACTORY'"):
        analyze("my_model.py")


def test_factory_file_can_import_its_siblings(tmp_path):
    """A factory file is imported with its own folder on sys.path (sibling imports work)."""
    (tmp_path / "helper_mod_nnperf_test.py").write_text("WIDTH = 6\n")
    (tmp_path / "uses.py").write_text(textwrap.dedent('''
        import torch
        from torch import nn
        from helper_mod_nnperf_test import WIDTH

        def make():
            return nn.Linear(4, WIDTH), (torch.randn(2, 4),)
    '''))
    a = analyze(f"{tmp_path / 'uses.py'}:make", train=False)
    assert [(g.m, g.n, g.k) for g in a.gemms] == [(2, 6, 4)]
