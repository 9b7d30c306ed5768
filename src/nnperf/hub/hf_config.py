"""Where a Hugging Face model's config comes from, in this order:

1. a local path: ``hf:./my-model/config.json`` or a folder holding ``config.json``;
2. the configs nnperf ships (``hf_configs/index.toml``): common names work offline and without
   a Hub token (meta-llama's and Gemma's repositories are gated);
3. the Hugging Face cache (``huggingface_hub.try_to_load_from_cache``: a model downloaded
   before);
4. the Hub, when online (``hf_hub_download`` of ``config.json`` alone: no weights). Offline
   (``HF_HUB_OFFLINE``, or the Hub's host not answering a connection within
   ``HUB_PROBE_TIMEOUT_S``) a name found nowhere above fails at once: the Hub client would
   otherwise retry for about 25 s and log each retry before giving up.

Only the config is read: the model is built from it on fake tensors. A config whose model
type transformers does not know needs the repository's own Python code; nnperf never runs it
(``trust_remote_code`` is not enabled silently) and says so.
"""

from __future__ import annotations

import difflib
import json
import math
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from nnperf.errors import ModelLoadError, ModelOptionError, shown
from nnperf.request import INDEX_MAX
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
    config_class = CONFIG_MAPPING[model_type]
    try:
        defaults = config_class()
    except Exception:  # a class that needs arguments: its fields are checked by transformers only
        defaults = None
    if defaults is not None:  # each field's kind first: 1e30 layers is not a whole number
        for key, value in config.items():
            if hasattr(defaults, key):
                config_value(getattr(defaults, key), value, f"hf:{name}: config field {key}")
    check_counts(config, f"hf:{name}")  # then the sizes, before transformers builds per-layer lists
    try:
        return config_class.from_dict(config)
    except Exception as err:  # a config class validates as it likes
        raise ModelLoadError(f"hf:{name}: transformers {transformers.__version__} cannot read this "
                             f"{model_type} config: {_one_line(err)}") from None


def config_value(current: Any, value: Any, what: str) -> Any:
    """``value`` for a config field that holds ``current``, of the same kind: a size stays a
    whole number (``1e30`` layers or ``2.5`` heads are refused, not built for minutes or
    truncated), a number stays finite, a switch stays true or false; a field of any other kind
    (a string, a list, None) takes the value as given."""
    if isinstance(current, bool):
        if not isinstance(value, bool):
            raise ModelOptionError(f"{what}: {shown(value)} is not true or false")
        return value
    if isinstance(current, int):
        whole = int(value) if isinstance(value, float) and value.is_integer() else value
        if isinstance(whole, bool) or not isinstance(whole, int) or abs(whole) > INDEX_MAX:
            raise ModelOptionError(f"{what}: {shown(value)} is not a whole number from -{INDEX_MAX:,} to "
                                   f"{INDEX_MAX:,}")
        return whole
    if isinstance(current, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ModelOptionError(f"{what}: {shown(value)} is not a finite number")
        return float(value)
    return value


def _no_constant(name: str) -> float:
    raise ValueError(f"{name}, which no config field may be")


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
        data = json.loads(path.read_text(encoding="utf-8"), parse_constant=_no_constant)
    except (OSError, UnicodeDecodeError) as err:
        raise ModelLoadError(f"hf:{name}: {shown(str(path))} cannot be read: {err}") from None
    except json.JSONDecodeError as err:
        raise ModelLoadError(f"hf:{name}: {shown(str(path))} is not JSON ({err})") from None
    except ValueError as err:  # NaN, Infinity
        raise ModelLoadError(f"hf:{name}: {shown(str(path))} holds {err}") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"hf:{name}: {shown(str(path))} is not a config (a JSON object)")
    return data


#: How long the Hub's host may take to accept a connection before it is called unreachable: a
#: connection inside one region takes milliseconds, across the world a few hundred.
HUB_PROBE_TIMEOUT_S = 2.0


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
    why_offline = hub_unreachable()
    if why_offline:
        raise ModelLoadError(_unreachable(name, why_offline))
    try:
        return huggingface_hub.hf_hub_download(name, "config.json"), f"Hugging Face Hub ({name})"
    except errors.GatedRepoError:
        raise ModelLoadError(f"hf:{name} is gated on the Hub: accept its licence and log in "
                             "(hf auth login), or give the path of its config.json") from None
    except (errors.RepositoryNotFoundError, errors.HFValidationError, errors.RevisionNotFoundError):
        raise ModelLoadError(f"hf:{name}: no such model on the Hugging Face Hub{_close(name)}") from None
    except errors.LocalEntryNotFoundError as err:  # offline and not cached
        raise ModelLoadError(_unreachable(name, type(err).__name__)) from None
    except errors.EntryNotFoundError:
        raise ModelLoadError(f"hf:{name} has no config.json on the Hub (not a transformers "
                             "model?)") from None
    except Exception as err:  # DNS, proxy, timeout: all the same to the user
        raise ModelLoadError(_unreachable(name, type(err).__name__)) from None


def hub_unreachable() -> str | None:
    """Why the Hub cannot be asked now (``HF_HUB_OFFLINE``; its host not resolving or not
    accepting a connection within ``HUB_PROBE_TIMEOUT_S``), or None when it can."""
    import socket
    import threading
    from urllib.parse import urlsplit

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    if os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy"):
        return None  # the proxy, not this host, connects: let the client try
    url = urlsplit(constants.ENDPOINT)
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    failed: list[str] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=HUB_PROBE_TIMEOUT_S).close()
        except OSError as err:
            failed.append(err.strerror or type(err).__name__)

    # in a thread: a name lookup has no timeout of its own, and a slow resolver can take long
    probe = threading.Thread(target=connect, daemon=True)
    probe.start()
    probe.join(HUB_PROBE_TIMEOUT_S)
    if probe.is_alive():
        return f"{host} did not answer within {HUB_PROBE_TIMEOUT_S:g} s"
    return f"{host} does not answer: {failed[0]}" if failed else None


def _unreachable(name: str, why: str) -> str:
    ids = sorted({entry.id for entry in shipped().values()}, key=str.lower)
    return (f"hf:{name}: not shipped with nnperf{_close(name)}, not in the Hugging Face cache, and "
            f"the Hub cannot be reached ({why}); shipped: {', '.join(ids)}; to add one, download "
            f"its config once (hf download {name} config.json) or give the path of a config.json")


def _close(name: str) -> str:
    close = difflib.get_close_matches(name.lower(), list(shipped()), n=3, cutoff=0.6)
    return f" (did you mean {', '.join(close)}?)" if close else ""


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:300]}"
