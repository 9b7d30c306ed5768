"""Where an hf: model's config comes from, and every bad input as one line (exit 3 for a
model that cannot be loaded, 2 for a bad setting): the shipped configs against their
published parameter counts, a local path or folder, the Hugging Face cache, the Hub (its
download function stood in for: no test touches the network), unknown ids offline, remote
code, a config transformers cannot build."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from nnperf.analysis import analyze
from nnperf.cli.app import cli
from nnperf.errors import ModelLoadError, ModelOptionError, UsageError
from nnperf.hub import hf_config
from nnperf.hub.hf_config import shipped

TINY_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 32,
              "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 97, "max_position_embeddings": 64}


transformers = pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Any attempt to reach the Hub fails as it does offline."""
    import huggingface_hub

    def offline(*args, **kwargs):
        raise huggingface_hub.errors.LocalEntryNotFoundError("offline (test)")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", "/nonexistent-hf-cache")
    monkeypatch.setattr(hf_config, "hub_unreachable", lambda: None)  # the download decides


@pytest.mark.parametrize("entry", sorted({e.id: e for e in shipped().values()}.values(), key=lambda e: e.id),
                         ids=lambda e: e.id)
def test_shipped_configs_give_the_published_parameter_count(entry):
    """Each shipped config, built by transformers on the meta device as the checkpoint's class,
    has the checkpoint's published parameter count (a mistyped size would not)."""
    from nnperf.hub.hf_config import from_dict

    config = from_dict(entry.load(), entry.id, transformers)
    with torch.device("meta"):
        model = getattr(transformers, entry.params_class)._from_config(config)
    assert sum(p.numel() for p in model.parameters()) == entry.params
    assert entry.source == f"https://huggingface.co/{entry.id}/blob/main/config.json"


def test_a_shipped_name_and_its_alias_trace_offline():
    a = analyze("hf:gpt2", batch=1, seq_len=8, n_layer=1)
    b = analyze("hf:openai-community/GPT2", batch=1, seq_len=8, n_layer=1)
    assert a.totals["flops"] == b.totals["flops"] and a.totals["params"] == b.totals["params"]
    assert "shipped with nnperf" in a.config["config_source"]
    assert a.config["task"] == "causal-lm" and a.config["model_class"] == "GPT2LMHeadModel"


def test_a_config_file_or_its_folder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA))
    by_file = analyze(f"hf:{tmp_path / 'config.json'}", batch=1, seq_len=8)
    by_folder = analyze(f"hf:{tmp_path}", batch=1, seq_len=8)
    assert by_file.totals["params"] == by_folder.totals["params"]
    assert by_file.config["config_source"].startswith("file ")


def _cache(root, repo: str, config: dict) -> None:
    """The Hugging Face cache layout: models--OWNER--NAME/{refs/main, snapshots/HASH/}."""
    folder = root / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text("0" * 40)
    snapshot = folder / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(config))


def test_a_model_in_the_hugging_face_cache(tmp_path, monkeypatch):
    import huggingface_hub

    _cache(tmp_path, "someone/tiny-llama", TINY_LLAMA)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    a = analyze("hf:someone/tiny-llama", batch=1, seq_len=8)
    assert a.config["config_source"].startswith("Hugging Face cache")
    assert a.config["model_class"] == "LlamaForCausalLM"


def test_a_model_downloaded_from_the_hub(tmp_path, monkeypatch):
    import huggingface_hub

    fetched = []

    def download(repo, filename):
        fetched.append((repo, filename))
        path = tmp_path / "config.json"
        path.write_text(json.dumps(TINY_LLAMA))
        return str(path)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    a = analyze("hf:someone/tiny-llama", batch=1, seq_len=8)
    assert fetched == [("someone/tiny-llama", "config.json")]  # the config alone, no weights
    assert a.config["config_source"] == "Hugging Face Hub (someone/tiny-llama)"


def test_offline_and_not_cached_is_one_line_with_what_would_work():
    with pytest.raises(ModelLoadError, match=r"hf:someone/unknown-model: not shipped "
                                             r"with nnperf, not in the Hugging Face cache, and the Hub "
                                             r"cannot be reached .*hf download someone/unknown-model "
                                             r"config.json"):
        analyze("hf:someone/unknown-model")


@pytest.mark.parametrize("offline", ["HF_HUB_OFFLINE", "a closed port"])
def test_offline_a_name_not_shipped_fails_before_any_download(offline, monkeypatch):
    """The Hub client retries an unreachable host for about 25 s, logging each retry: nnperf
    asks it nothing when HF_HUB_OFFLINE is set or the Hub's host refuses a connection."""
    import huggingface_hub

    monkeypatch.undo()  # the real probe, and a download that must not be called
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", "/nonexistent-hf-cache")
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda *a, **k: pytest.fail("the Hub was asked"))
    if offline == "HF_HUB_OFFLINE":
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
        why = "HF_HUB_OFFLINE is set"
    else:  # port 9 (discard) on the loopback: nothing listens there in a test
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")
        why = "127.0.0.1 does not answer"
    with pytest.raises(ModelLoadError, match=rf"hf:someone/x: not shipped .*\({why}.*\); shipped: "
                                             r".*openai-community/gpt2.*; to add one, download its config "
                                             r"once \(hf download someone/x config.json\)") as err:
        analyze("hf:someone/x")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("change", "error", "message"), [
    ({"num_hidden_layers": 1e30}, ModelOptionError, r"config field num_hidden_layers: '1e\+30' is not a whole number"),
    ({"num_attention_heads": 2.5}, ModelOptionError, r"config field num_attention_heads: '2\.5' is not a whole number"),
    ({"tie_word_embeddings": "yes"}, ModelOptionError, r"config field tie_word_embeddings: 'yes' is not true or false"),
])
def test_a_local_config_field_of_the_wrong_kind_is_refused_before_building(tmp_path, change, error, message):
    (tmp_path / "config.json").write_text(json.dumps({**TINY_LLAMA, **change}))
    with pytest.raises(error, match=message):
        analyze(f"hf:{tmp_path}", batch=1, seq_len=8)


def test_nan_in_a_local_config_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA).replace('"hidden_size": 32', '"hidden_size": NaN'))
    with pytest.raises(ModelLoadError, match=r"holds NaN, which no config field may be"):
        analyze(f"hf:{tmp_path}", batch=1, seq_len=8)


@pytest.mark.parametrize(("value", "message"), [
    (1e30, r"-O num_hidden_layers='1e\+30': '1e\+30' is not a whole number"),
    (2.5, r"'2\.5' is not a whole number"),
])
def test_an_override_keeps_the_fields_kind(tmp_path, value, message):
    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA))
    with pytest.raises(ModelOptionError, match=message):
        analyze(f"hf:{tmp_path}", batch=1, seq_len=8, num_hidden_layers=value)


def test_a_near_miss_of_a_shipped_name_is_suggested():
    with pytest.raises(ModelLoadError, match=r"did you mean meta-llama/llama-3\.1-8b"):
        analyze("hf:meta-llama/Llama-3.1-8", batch=1)


def test_remote_code_is_refused(tmp_path):
    custom = {"model_type": "my_model", "auto_map": {"AutoConfig": "configuration_my.MyConfig"}}
    (tmp_path / "config.json").write_text(json.dumps(custom))
    with pytest.raises(ModelLoadError, match=r"model_type 'my_model' is not in transformers .* "
                                             r"\(its auto_map points at the repository's own code\); "
                                             r"nnperf does not run a repository's own code \(trust_remote_code\)"):
        analyze(f"hf:{tmp_path}")


def test_a_config_transformers_cannot_build(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**TINY_LLAMA, "hidden_act": "no-such-activation"}))
    with pytest.raises(ModelLoadError, match=r"cannot build LlamaForCausalLM from this config: KeyError"):
        analyze(f"hf:{tmp_path}", batch=1, seq_len=8)


@pytest.mark.parametrize(("content", "message"), [
    ("{not json", "is not JSON"),
    ("[1, 2]", "is not a config"),
    ('{"hidden_size": 3}', "has no model_type"),
])
def test_a_broken_config_file(tmp_path, content, message):
    (tmp_path / "config.json").write_text(content)
    with pytest.raises(ModelLoadError, match=message):
        analyze(f"hf:{tmp_path / 'config.json'}")


def test_a_missing_local_file():
    with pytest.raises(ModelLoadError, match=r"config file '\./nope/config\.json' does not exist"):
        analyze("hf:./nope/config.json")


def test_bad_settings_are_usage_errors(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA))
    path = f"hf:{tmp_path}"
    with pytest.raises(ModelOptionError, match=r"LlamaConfig of .* has no field 'num_layers'"):
        analyze(path, num_layers=2)
    with pytest.raises(ModelOptionError, match=r"--seq 65 exceeds .*positions \(64\)"):
        analyze(path, seq_len=65)
    with pytest.raises(UsageError, match=r"--task image-cls: .*\(llama\) has no such head .*its "
                                         r"tasks: causal-lm, seq-cls"):
        analyze(path, task="image-cls")
    with pytest.raises(UsageError, match="makes its own inputs"):
        analyze(path, inputs=(torch.zeros(1, 8, dtype=torch.long),))


def test_tasks_pick_their_head_and_labels(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA))
    cls = analyze(f"hf:{tmp_path}", batch=2, seq_len=8, task="seq-cls")
    assert cls.config["model_class"] == "LlamaForSequenceClassification"
    base = analyze(f"hf:{tmp_path}", batch=2, seq_len=8, task="base")
    assert base.config["model_class"] == "LlamaModel"
    # the sequence classifier's head is hidden x num_labels (2) instead of hidden x vocab
    assert base.totals["params"] + 32 * 2 == cls.totals["params"]


def test_the_vit_config_traces_as_an_image_classifier():
    a = analyze("hf:google/vit-base-patch16-224", batch=1, num_hidden_layers=1)
    assert a.config["task"] == "image-cls"
    assert a.config["inputs"][0]["shape"] == [1, 3, 224, 224]


def test_cli_predicts_an_hf_model_by_name():
    r = CliRunner().invoke(cli, ["predict", "hf:meta-llama/Llama-3.1-8B", "--gpu", "h100", "--batch",
                                 "1", "--seq", "64", "-O", "num_hidden_layers=1", "--attn-implementation",
                                 "sdpa", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["config"]["task"] == "causal-lm"
    assert doc["config"]["attn_implementation"] == "sdpa"


@pytest.mark.parametrize(("args", "code", "message"), [
    (["hf:someone/unknown-model"], 3, "not shipped with nnperf"),
    (["hf:gpt2", "-O", "n_layers=1"], 2, "has no field 'n_layers'"),
    (["mlp", "--task", "causal-lm"], 2, "--task causal-lm is not used"),
])
def test_cli_errors_are_one_line(args, code, message):
    r = CliRunner().invoke(cli, ["analyze", *args])
    assert r.exit_code == code, r.output
    assert message in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1
