"""Where a Hugging Face model's config comes from, in this order:

1. a local path: ``hf:./my-model/config.json`` or a folder holding ``config.json``;
2. the configs nnperf ships (``hf_configs/index.toml``): common names work offline and without
   a Hub token (meta-llama's and Gemma's repositories are gated);
3. the Hugging Face cache (``huggingface_hub.try_to_load_from_cache``: a model downloaded
   before);
4. the Hub, when online (``hf_hub_download`` of ``config.json`` alone: no weights).

Only the config is read: the model is built from it on fake tensors. A config whose model
type transformers does not know needs the repository's own Python code; nnperf never runs it
(``trust_remote_code`` is not enabled silently) and says so.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from nnperf.errors import ModelLoadError, shown
from nnperf.trace.limits import check_counts

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

CONFIG_DIR = Path(__file__).with_name("hf_configs")


@dataclass(frozen=True)
class ShippedConfig:
    """One entry of ``hf_configs/index.toml``."""

    id: str
    aliases: tuple[str, ...]
    file: str
    source: str
    params: int
    params_class: str
    params_source: str

    def load(self) -> dict[str, Any]:
        return json.loads((CONFIG_DIR / self.file).read_text(encoding="utf-8"))


@cache
def shipped() -> dict[str, ShippedConfig]:
    """Shipped configs by lower-cased id and alias (Hub ids are case-insensitive)."""
    raw = tomllib.loads((CONFIG_DIR / "index.toml").read_text(encoding="utf-8"))
    out: dict[str, ShippedConfig] = {}
    for row in raw["config"]:
        entry = ShippedConfig(**{**row, "aliases": tuple(row.get("aliases", ()))})
        for key in (entry.id, *entry.aliases):
            out[key.lower()] = entry
    return out


def find_config(name: str, transformers: ModuleType) -> tuple[Any, str]:
    """The ``PretrainedConfig`` for ``hf:NAME`` and where it came from (for the report)."""
    path = _local_path(name)
    if path is not None:
        return from_dict(_read_json(path, name), name, transformers), f"file {path}"
    entry = shipped().get(name.lower())
    if entry is not None:
        return from_dict(entry.load(), name, transformers), f"shipped with nnperf ({entry.source})"
    file, where = _from_hub(name)
    return from_dict(_read_json(Path(file), name), name, transformers), where


def from_dict(config: dict[str, Any], name: str, transformers: ModuleType) -> Any:
    """A config object of transformers' own class for ``config["model_type"]``."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        raise ModelLoadError(f"hf:{name}: its config.json has no model_type; transformers cannot "
                             "tell which architecture it is")
    if model_type not in CONFIG_MAPPING:
        code = " (its auto_map points at the repository's own code)" if "auto_map" in config else ""
        raise ModelLoadError(
            f"hf:{name}: model_type {model_type!r} is not in transformers "
            f"{transformers.__version__}{code}; nnperf does not run a repository's own code "
            "(trust_remote_code): upgrade transformers if a newer release has it, or write a "
            "factory (PATH.py:FACTORY) that builds the model"
        )
    check_counts(config, f"hf:{name}")  # before transformers builds per-layer lists from them
    try:
        return CONFIG_MAPPING[model_type].from_dict(config)
    except Exception as err:  # a config class validates as it likes
        raise ModelLoadError(f"hf:{name}: transformers {transformers.__version__} cannot read this "
                             f"{model_type} config: {_one_line(err)}") from None


def _local_path(name: str) -> Path | None:
    """``name`` as a file or folder, when it is spelled like one or exists."""
    looks_local = name.endswith(".json") or name.startswith((".", "/", "~")) or "\\" in name
    path = Path(name).expanduser()
    try:
        exists = path.exists()
    except OSError:  # a name too long for the file system
        exists = False
    if not exists and not looks_local:
        return None  # a Hub id (owner/name) that is not a folder here
    if not exists:
        raise ModelLoadError(f"hf:{name}: config file {shown(name)} does not exist; give a "
                             "config.json (or its folder) or a Hugging Face model id")
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise ModelLoadError(f"hf:{name}: folder {shown(name)} has no config.json")
    return path


def _read_json(path: Path, name: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        raise ModelLoadError(f"hf:{name}: {shown(str(path))} cannot be read: {err}") from None
    except json.JSONDecodeError as err:
        raise ModelLoadError(f"hf:{name}: {shown(str(path))} is not JSON ({err})") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"hf:{name}: {shown(str(path))} is not a config (a JSON object)")
    return data


def _from_hub(name: str) -> tuple[str, str]:
    """``config.json`` from the cache, else downloaded; one line when neither works."""
    import huggingface_hub
    from huggingface_hub import errors

    try:
        cached = huggingface_hub.try_to_load_from_cache(name, "config.json")
    except Exception:  # an id the cache cannot even look up
        cached = None
    if isinstance(cached, str):
        return cached, f"Hugging Face cache ({cached})"
    try:
        return huggingface_hub.hf_hub_download(name, "config.json"), f"Hugging Face Hub ({name})"
    except errors.GatedRepoError:
        raise ModelLoadError(f"hf:{name} is gated on the Hub: accept its licence and log in "
                             "(hf auth login), or give the path of its config.json") from None
    except (errors.RepositoryNotFoundError, errors.HFValidationError, errors.RevisionNotFoundError):
        raise ModelLoadError(f"hf:{name}: no such model on the Hugging Face Hub{_close(name)}") from None
    except errors.LocalEntryNotFoundError as err:  # offline (HF_HUB_OFFLINE) and not cached
        raise ModelLoadError(_unreachable(name, err)) from None
    except errors.EntryNotFoundError:
        raise ModelLoadError(f"hf:{name} has no config.json on the Hub (not a transformers "
                             "model?)") from None
    except Exception as err:  # DNS, proxy, timeout: all the same to the user
        raise ModelLoadError(_unreachable(name, err)) from None


def _unreachable(name: str, err: BaseException) -> str:
    return (f"hf:{name}: no config found: not shipped with nnperf{_close(name)}, not in the "
            f"Hugging Face cache, and the Hub cannot be reached ({type(err).__name__}); download "
            f"it once (hf download {name} config.json) or give a path to its config.json")


def _close(name: str) -> str:
    close = difflib.get_close_matches(name.lower(), list(shipped()), n=3, cutoff=0.6)
    return f" (did you mean {', '.join(close)}?)" if close else ""


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:300]}"
