"""The time of one NCCL collective on a cluster, from bus bandwidth and latency.

nccl-tests (github.com/NVIDIA/nccl-tests, doc/PERFORMANCE.md) reports for a collective of
S bytes on n ranks taking t seconds the algorithm bandwidth S/t and the bus bandwidth
busbw = S/t x factor, the factor being what each rank must send over its link with the ring
algorithm: 2(n-1)/n for all-reduce (reduce-scatter then all-gather), (n-1)/n for all-gather,
reduce-scatter and all-to-all, 1 for broadcast and send/recv. Bus bandwidth is the number
that does not depend on n, so the model is its inverse:

    t = latency + S x factor(n) / busbw(tier)

with the tier the group crosses: inside one node (NVLink/NVSwitch) or across nodes. Across
nodes NCCL builds one ring per NIC (rail) and splits the collective over them through NVLink
(NCCL issue #601, S. Jeaugey: "NCCL detects the 4 NICs ... and creates 4 rings, each using a
different NIC"; "multi-NIC aggregation works well when GPUs are connected through NVLink
(because we can use NVLink to split the operations in N parts then balance the traffic onto
the N NICs)"), so a group with g GPUs in each node (one NIC each) reaches g NICs' bus
bandwidth, at most the NVLink tier's: ``busbw = min(intra, g x inter)``. A group of one GPU
per node (data parallelism across tensor-parallel nodes) runs at one NIC's rate; two full
DGX H100 nodes reach 8 x 50 GB/s x 0.8 = 320 GB/s, below the 360 GB/s reported for a 2-node
HGX test in NCCL issue #1277. S is the nccl-tests size (all-gather: the gathered output;
reduce-scatter: the input).

An all-to-all has no ring to split over the rails: every rank sends S/n to each other rank,
so of its S the (n - g)/n bound for the other nodes (g: the group's GPUs in its node) leave
through the node's NICs, which its g GPUs share evenly, while the (g - 1)/n for its own node
go over NVLink at the same time: ``t = latency + max(S (n - g)/n / nic, S (g' - 1)/n /
intra)``, ``nic`` one NIC's bus bandwidth, g the fewest of the group's GPUs in a node and g'
the most (the slowest rank of each kind). For 16 GPUs on two DGX H100 nodes that is half of
S at 40 GB/s, where the ring formula would give 320 GB/s for all of it; DeepEP's README
(deepseek-ai/DeepEP, H800 with ConnectX-7 400 Gb/s) measures its internode dispatch and combine,
NCCL-free kernels built to fill the network, at a bottleneck of 43-58 GB/s per GPU of RDMA
for 16 to 64 ranks.

The latency is NCCL's own model (``kernels.nccl_tuning``): all-reduce, all-gather and
reduce-scatter run with the algorithm and protocol NCCL's tuner picks for the size and the
group (ring, tree, PAT, NVLS or NVLS tree; LL, LL128 or Simple), each with its latency, which grows with the
ring's hops: a 1024-rank ring all-gather pays milliseconds before its first byte counts, an
8-GPU one tens of microseconds. All-to-all, send/recv and broadcast keep the tier's
``latency_us`` (NCCL's tuning model has no point-to-point term). An all-reduce inside an
NVSwitch node with NVLink SHARP runs at the bus bandwidth the cluster file states from
nccl-tests (~480 GB/s on H100 against the ring's ~370); across such nodes NVLS tree, up to
twice the network's ring bandwidth on two nodes. What is not modelled yet: CollNet (SHARP in
the network switch) on SHARP fabrics; contention of several groups on one NIC. The model against
published nccl-tests tables: ``validation/nccl_compare.py``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from nnperf.hardware.cluster import Cluster, Tier
from nnperf.kernels.nccl_tuning import TUNED_KINDS, Topology, choose

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv")


def bus_factor(kind: str, n: int) -> float:
    """Bytes each rank moves over its link per byte of the collective (nccl-tests)."""
    if n <= 1:
        return 0.0
    if kind == "all_reduce":
        return 2 * (n - 1) / n
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if kind in ("broadcast", "send_recv"):
        return 1.0
    raise ValueError(f"unknown collective kind {kind!r}; valid: {', '.join(KINDS)}")


@dataclass(frozen=True)
class CollectiveEstimate:
    kind: str
    bytes: int
    group_size: int
    tier: str  # intra | inter | none (a group of one)
    busbw: float
    latency_s: float
    time_s: float
    algorithm: str = ""  # ring | tree | pat (NCCL's choice); "" where NCCL's model does not say
    protocol: str = ""  # LL | LL128 | Simple

    @property
    def algbw(self) -> float:
        """nccl-tests' algorithm bandwidth, S / t."""
        return self.bytes / self.time_s if self.time_s else 0.0


def gpus_per_node(cluster: Cluster, group_ranks: tuple[int, ...]) -> Counter[int]:
    """How many of the group's ranks each node holds (ranks numbered node by node)."""
    return Counter(r // cluster.gpus_per_node for r in group_ranks)


def group_tier(cluster: Cluster, group_ranks: tuple[int, ...]) -> Tier:
    """The slowest tier a group's ring crosses: the NICs as soon as it spans two nodes."""
    return cluster.inter if len(gpus_per_node(cluster, group_ranks)) > 1 else cluster.intra


def estimate_collective(kind: str, nbytes: int, group_ranks: tuple[int, ...], cluster: Cluster) -> CollectiveEstimate:
    n = len(group_ranks)
    if n <= 1 or nbytes == 0:
        return CollectiveEstimate(kind, nbytes, n, "none", 0.0, 0.0, 0.0)
    per_node = gpus_per_node(cluster, group_ranks)
    tier = cluster.inter if len(per_node) > 1 else cluster.intra
    busbw = tier.busbw
    if tier is cluster.inter:  # one ring per NIC (rail): as many as the group's fewest GPUs in a node
        busbw = min(cluster.intra.busbw, min(per_node.values()) * tier.busbw)
    if kind == "all_to_all" and tier is cluster.inter:  # module docstring
        fewest, most = min(per_node.values()), max(per_node.values())
        moving = max(nbytes * (n - fewest) / n / tier.busbw, nbytes * (most - 1) / n / cluster.intra.busbw)
        return CollectiveEstimate(kind, nbytes, n, tier.name, nbytes * bus_factor(kind, n) / moving,
                                  tier.latency_s, tier.latency_s + moving)
    if kind not in TUNED_KINDS:
        time = tier.latency_s + nbytes * bus_factor(kind, n) / busbw
        return CollectiveEstimate(kind, nbytes, n, tier.name, busbw, tier.latency_s, time)
    topo = Topology(n, len(per_node), cluster.intra.link, cluster.host_cpu, cluster.generation,
                    tier.collective_ctas or 16, cluster.intra.nvls_busbw)
    choice = choose(kind, nbytes, bus_factor(kind, n), busbw, topo)
    return CollectiveEstimate(kind, nbytes, n, tier.name, busbw, choice.latency_s, choice.time_s,
                              choice.algorithm, choice.protocol)
