"""Library models' errors that need no library installed: a missing optional dependency, a
torchvision that does not load with this torch, an empty name, hf-only options elsewhere."""

from __future__ import annotations

import sys

import pytest
import torch

from nnperf.analysis import analyze
from nnperf.errors import ModelLoadError, UsageError


def test_missing_transformers_says_which_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if not installed
    with pytest.raises(ModelLoadError, match=r"hf:gpt2 needs transformers, which is not installed: "
                                             r"pip install 'nnperf\[hf\]'"):
        analyze("hf:gpt2")


def test_a_broken_torchvision_names_the_release_that_pairs_with_this_torch(monkeypatch):
    from nnperf.hub import common

    real_import = common.importlib.import_module

    def broken(name):
        if name == "torchvision":  # what a CPU-only torch with a CUDA torchvision wheel gives
            raise OSError("libtorch_cuda.so: cannot open shared object file: No such file or directory")
        return real_import(name)

    monkeypatch.setattr(common.importlib, "import_module", broken)
    minor = int(torch.__version__.split(".")[1])
    with pytest.raises(ModelLoadError, match=rf"tv:resnet50 needs torchvision, but it cannot be "
                                             rf"imported with torch .*install torchvision 0\.{minor + 15}"):
        analyze("tv:resnet50")


def test_an_empty_name_after_the_prefix_is_one_line():
    with pytest.raises(ModelLoadError, match="give a model name after 'timm:'"):
        analyze("timm:")


def test_task_and_attention_options_are_refused_for_other_models():
    with pytest.raises(UsageError, match="--task causal-lm is not used"):
        analyze("mlp", task="causal-lm")
    with pytest.raises(UsageError, match="--attn-implementation sdpa is not used"):
        analyze("gpt2", attn_implementation="sdpa")


def test_nnperf_models_lists_the_shipped_hugging_face_configs():
    from click.testing import CliRunner

    from nnperf.cli.app import cli

    r = CliRunner().invoke(cli, ["models"])
    assert r.exit_code == 0, r.output
    assert "meta-llama/Llama-3.1-8B" in r.output and "timm:NAME" in r.output
