"""The time of one NCCL collective on a cluster, from bus bandwidth and latency.

nccl-tests (github.com/NVIDIA/nccl-tests, doc/PERFORMANCE.md) reports for a collective of
S bytes on n ranks taking t seconds the algorithm bandwidth S/t and the bus bandwidth
busbw = S/t x factor, the factor being what each rank must send over its link with the ring
algorithm: 2(n-1)/n for all-reduce (reduce-scatter then all-gather), (n-1)/n for all-gather,
reduce-scatter and all-to-all, 1 for broadcast and send/recv. Bus bandwidth is the number
that does not depend on n, so the model is its inverse:

    t = latency + S x factor(n) / busbw(tier)

with the tier the group crosses: inside one node (NVLink/NVSwitch) or across nodes (the NICs,
one per GPU: a ring across nodes runs at the NIC rate). S is the nccl-tests size (all-gather:
the gathered output; reduce-scatter: the input). What is not modelled yet: NCCL's tree and
NVLS (NVLink SHARP) algorithms, which beat the ring's bound for large cross-node all-reduces
and small messages; protocol switches (LL/LL128/Simple) with message size; contention of
several groups on one NIC.
"""

from __future__ import annotations

from dataclasses import dataclass

from nnperf.hardware.cluster import Cluster, Tier

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

    @property
    def algbw(self) -> float:
        """nccl-tests' algorithm bandwidth, S / t."""
        return self.bytes / self.time_s if self.time_s else 0.0


def group_tier(cluster: Cluster, group_ranks: tuple[int, ...]) -> Tier:
    """The slowest tier a group's ring crosses: the NICs as soon as it spans two nodes."""
    nodes = {r // cluster.gpus_per_node for r in group_ranks}
    return cluster.inter if len(nodes) > 1 else cluster.intra


def estimate_collective(kind: str, nbytes: int, group_ranks: tuple[int, ...], cluster: Cluster) -> CollectiveEstimate:
    n = len(group_ranks)
    if n <= 1 or nbytes == 0:
        return CollectiveEstimate(kind, nbytes, n, "none", 0.0, 0.0, 0.0)
    tier = group_tier(cluster, group_ranks)
    time = tier.latency_s + nbytes * bus_factor(kind, n) / tier.busbw
    return CollectiveEstimate(kind, nbytes, n, tier.name, tier.busbw, tier.latency_s, time)
