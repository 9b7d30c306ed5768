"""The host CPU eager PyTorch dispatches from: its dispatch costs are a property of the host.

Every eager op costs the host thread Python, dispatcher and launch work before its kernel can
start; small batches are bound by it. That work runs on one core, so a faster core issues ops
faster. ``hosts.toml`` lists common server CPUs (and the desktop CPU of a published
measurement) with their datasheet single-core turbo clocks; ``with_host`` rescales a profile's
host costs from the clock they were stated for (``DeviceProfile.host_turbo_ghz``) to the named
host's. A profile calibrated on the host itself (``nnperf calibrate``) needs no rescaling.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from nnperf.errors import UsageError, shown
from nnperf.hardware import schema
from nnperf.hardware.profile import DeviceProfile

HOSTS_FILE = Path(__file__).parent / "hosts.toml"
#: The host the shipped default profile's costs were measured on (``default_profile.toml``'s
#: ``host``): what a cluster without a ``host`` of its own is planned with.
DEFAULT_HOST = "cloud-vm"
#: The host costs in seconds of one core's work (``host_in_context`` is a ratio: it stays).
_HOST_FIELDS = ("host_dispatch_s", "host_view_s", "host_python_call_s", "host_autograd_record_s",
                "host_view_autograd_s", "host_module_call_s", "host_module_hook_s", "host_autocast_op_s",
                "host_backward_node_s", "host_backward_call_s", "host_zero_grad_param_s", "host_dtensor_dispatch_s",
                "host_dtensor_list_tensor_s")
_HOST_TABLES = ("host_dispatch_by_kind_s", "host_optimizer_step_s", "host_optimizer_param_s")


@dataclass(frozen=True)
class Host:
    id: str
    name: str
    turbo_ghz: float
    systems: tuple[str, ...]
    source: str


@cache
def list_hosts() -> dict[str, Host]:
    """Every host of ``hosts.toml`` by id."""
    raw = schema.read_toml(HOSTS_FILE, "host file")
    valid = schema.PROFILE_RANGES["host_turbo_ghz"]
    out = {}
    for key, entry in raw.get("hosts", {}).items():
        if not valid.admits(entry.get("turbo_ghz")) or not entry.get("source"):
            raise ValueError(f"{HOSTS_FILE}: host {key!r} needs turbo_ghz ({valid.describe()}) and a source")
        out[key] = Host(key, entry["name"], float(entry["turbo_ghz"]), tuple(entry.get("systems", ())),
                        entry["source"])
    return out


def load_host(name: str) -> Host:
    """The host called ``name`` (an id of ``hosts.toml``, or a system it sits in, e.g. "DGX A100")."""
    hosts = list_hosts()
    key = name.strip().lower()
    for host in hosts.values():
        if key == host.id or key in (s.lower() for s in host.systems):
            return host
    close = difflib.get_close_matches(key, list(hosts), n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    raise UsageError(f"unknown host {shown(name)}; {hint}valid hosts: {', '.join(hosts)}")


def with_host(profile: DeviceProfile, host: Host) -> DeviceProfile:
    """``profile`` with its host costs moved to ``host``: every host_* cost times the ratio
    of the single-core clock they were stated for to the host's."""
    scale = profile.host_turbo_ghz / host.turbo_ghz
    changes = {f: getattr(profile, f) * scale for f in _HOST_FIELDS}
    tables = {t: {k: v * scale for k, v in getattr(profile, t).items()} for t in _HOST_TABLES}
    return dataclasses.replace(profile, **changes, **tables, host_turbo_ghz=host.turbo_ghz, host=host.id)
