"""A cluster: GPUs per node and the two tiers of links collectives cross.

One TOML file per cluster (``hardware/clusters/*.toml``; a user's own with ``--cluster
FILE``): the GPU, GPUs per node, and per tier (``intra``: NVLink/NVSwitch inside a node,
``inter``: the NICs between nodes) the link bandwidth per GPU each way (datasheet), the
measured fraction of it that NCCL's ring reaches on large messages, the latency of an
all-to-all or send/recv (the other collectives' latency is NCCL's own model), and (optional)
``collective_ctas``: the thread blocks a collective's kernel runs, one per NCCL channel, each
holding an SM that compute kernels overlapping it cannot use (``passes.comm_timeline``;
absent: that slowdown is not modelled for the tier). Two facts feed
NCCL's own latency model (``kernels.nccl_tuning``): ``host_cpu`` (``intel`` or ``amd``: NCCL's
cost of posting a network send) and ``intra.link`` (``nvlink`` or ``pcie``: the per-hop latency
inside a node, and whether NCCL runs its LL128 protocol); both default to a DGX-like node.
``host`` (optional): the nodes' CPU, an id of ``hardware/hosts.toml`` or a system it sits in, whose
single-core clock the plan rescales the eager host costs to (``hardware.host.with_host``: a
rank's host time, the launches and dispatch of its ops); absent, the default profile's host,
the cloud VM a rented GPU comes with.
``intra.nvls_busbw_gbs`` (optional): the nccl-tests bus bandwidth of an all-reduce that NVLink
SHARP reduces in the switch (Hopper NVSwitch nodes); absent, NCCL's NVLS is not modelled.
Values nobody measured are listed in ``unverified``; ``sources`` says where the others come
from.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nnperf import fields
from nnperf.errors import UsageError
from nnperf.hardware.host import DEFAULT_HOST, load_host
from nnperf.hardware.schema import read_toml

CLUSTER_DIR = Path(__file__).parent / "clusters"
#: Valid ranges: a number outside is a typo (GB/s each way per GPU, a fraction, microseconds).
RANGES = {"link_gbs": (0.1, 10_000.0), "efficiency": (0.01, 1.0), "latency_us": (0.1, 10_000.0)}
CTA_RANGE = (1, 1024)
HOST_CPUS = ("intel", "amd")
INTRA_LINKS = ("nvlink", "pcie")


@dataclass(frozen=True)
class Tier:
    """One kind of link, per GPU: ``busbw`` is what a large ring collective reaches."""

    name: str
    link_bytes_per_s: float
    efficiency: float
    latency_s: float
    collective_ctas: int | None = None
    link: str = "nvlink"  # nvlink | pcie (inside a node); net (between nodes)
    nvls_busbw: float = 0.0  # bytes/s of an NVLink SHARP all-reduce (nccl-tests busbw); 0: none

    @property
    def busbw(self) -> float:
        return self.link_bytes_per_s * self.efficiency


@dataclass(frozen=True)
class Cluster:
    id: str
    name: str
    gpu: str
    gpus_per_node: int
    intra: Tier
    inter: Tier
    unverified: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    host_cpu: str = "intel"  # intel | amd: NCCL's network post overhead
    generation: str = "hopper"  # the GPU's architecture, lower case (NCCL's LL bandwidth cap)
    host: str = DEFAULT_HOST  # the nodes' CPU, an id of hardware/hosts.toml: its dispatch costs

    def to_json(self) -> dict[str, Any]:
        def tier(t: Tier) -> dict[str, Any]:
            return {"link_gbs": t.link_bytes_per_s / 1e9, "efficiency": t.efficiency,
                    "latency_us": t.latency_s * 1e6, "busbw_gbs": t.busbw / 1e9,
                    "collective_ctas": t.collective_ctas}

        return {"id": self.id, "name": self.name, "gpu": self.gpu, "gpus_per_node": self.gpus_per_node,
                "intra": tier(self.intra), "inter": tier(self.inter), "host": self.host,
                "unverified": list(self.unverified), "sources": list(self.sources)}


def list_clusters() -> list[str]:
    return sorted(p.stem for p in CLUSTER_DIR.glob("*.toml"))


def load_cluster(name_or_path: str) -> Cluster:
    """A built-in cluster by id (``dgx-h100``) or a TOML file of the same form."""
    path = CLUSTER_DIR / f"{name_or_path}.toml"
    if not path.exists():
        path = Path(name_or_path)
        if path.suffix != ".toml":
            raise UsageError(f"unknown cluster '{name_or_path}'; built-in: {', '.join(list_clusters())}, "
                             "or a TOML file")
    data = read_toml(path, "cluster file")
    origin = f"cluster file {path.name}"
    missing = [key for key in ("name", "gpu", "gpus_per_node", "intra", "inter") if key not in data]
    if missing:
        raise UsageError(f"{origin}: field '{missing[0]}' is missing; expected name, gpu, gpus_per_node, "
                         "[intra] and [inter] with link_gbs, efficiency, latency_us")
    gpus_per_node = fields.integer(data["gpus_per_node"], f"{origin}: field 'gpus_per_node'", 1, 1024)
    tiers = [_tier(origin, key, data[key]) for key in ("intra", "inter")]
    name = fields.text(data["name"], f"{origin}: field 'name'")
    gpu = fields.text(data["gpu"], f"{origin}: field 'gpu'")
    host_cpu = fields.text(data.get("host_cpu", "intel"), f"{origin}: field 'host_cpu'", HOST_CPUS)
    host = _host(data.get("host", DEFAULT_HOST), origin)
    return Cluster(path.stem, name, gpu, gpus_per_node, *tiers,
                   fields.texts(data.get("unverified", []), f"{origin}: field 'unverified'"),
                   fields.texts(data.get("sources", []), f"{origin}: field 'sources'"),
                   host_cpu, _generation(gpu, origin), host)


def _host(value: Any, origin: str) -> str:
    """The id of the host a cluster file names, by id or by a system it sits in, as ``--host``
    takes it; an unknown one is one line naming the file and the valid hosts."""
    name = fields.text(value, f"{origin}: field 'host'")
    try:
        return load_host(name).id
    except UsageError as err:
        raise UsageError(f"{origin}: field 'host': {err}") from None


def _generation(gpu_id: str, origin: str) -> str:
    """The cluster GPU's architecture, lower case: a GPU of the catalog, refused at once
    otherwise (a typo would be planned as another GPU's links for minutes)."""
    from nnperf.hardware.catalog import list_gpus, load_gpu

    try:
        return load_gpu(gpu_id).architecture.lower()
    except UsageError:
        raise UsageError(f"{origin}: field 'gpu' is {gpu_id!r}, which is no GPU of the catalog; give one "
                         f"of its ids ({', '.join(g.id for g in list_gpus())})") from None


def cluster_for_gpu(gpu_id: str) -> Cluster | None:
    """The built-in cluster built of this GPU, if there is one."""
    for name in list_clusters():
        cluster = load_cluster(name)
        if cluster.gpu == gpu_id:
            return cluster
    return None


def _tier(origin: str, key: str, table: Any) -> Tier:
    if not isinstance(table, dict):
        raise UsageError(f"{origin}: [{key}] must be a table")
    values = {}
    for field, (low, high) in RANGES.items():
        value = table.get(field)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not low <= value <= high:
            raise UsageError(f"{origin}: field '{key}.{field}' is {value!r}; expected a number in {low}..{high}")
        values[field] = float(value)
    ctas = table.get("collective_ctas")
    low, high = CTA_RANGE
    if ctas is not None and (not isinstance(ctas, int) or isinstance(ctas, bool) or not low <= ctas <= high):
        raise UsageError(f"{origin}: field '{key}.collective_ctas' is {ctas!r}; expected a whole number in "
                         f"{low}..{high} (thread blocks of a collective's kernel), or leave it out")
    link = table.get("link", "nvlink") if key == "intra" else "net"
    if link not in (INTRA_LINKS if key == "intra" else ("net",)):
        raise UsageError(f"{origin}: field '{key}.link' is {link!r}; expected one of {', '.join(INTRA_LINKS)}")
    nvls = table.get("nvls_busbw_gbs", 0.0) if key == "intra" else 0.0
    if not isinstance(nvls, (int, float)) or isinstance(nvls, bool) or not 0 <= nvls <= RANGES["link_gbs"][1]:
        raise UsageError(f"{origin}: field '{key}.nvls_busbw_gbs' is {nvls!r}; expected GB/s (nccl-tests bus "
                         "bandwidth of an all-reduce with NVLink SHARP), or leave it out")
    return Tier(key, values["link_gbs"] * 1e9, values["efficiency"], values["latency_us"] * 1e-6, ctas, link,
                float(nvls) * 1e9)
