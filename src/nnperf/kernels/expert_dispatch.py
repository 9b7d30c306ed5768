"""The time of DeepEP's dispatch and combine: Megatron-Core's flex token dispatcher.

A token routed to ``k`` experts leaves its rank as ``k`` copies under NCCL's all-to-all (the
alltoall dispatcher, ``kernels.collectives``), so each copy bound for an expert on another node
crosses the network. DeepEP's normal kernels (deepseek-ai/DeepEP, README: "Normal kernels with
NVLink and RDMA forwarding"; the DeepSeek-V3 report, section 3.2.2) send a token once to each
other node that holds at least one of its experts, to the GPU of the same local index there,
which forwards it over NVLink to the GPUs of its experts; the combine runs it backwards, each
node summing a token's expert outputs before the one copy crosses back. HybridEP, the flex
dispatcher's other backend, moves the same bytes (Megatron-Core's MoE README: "functions
similar to DeepEP").

With the ``k`` experts of a token drawn uniformly from ``E`` (the planner's routing
assumption, ``trace.routing``) and the group's experts spread evenly over its ``m`` nodes
(``E / m`` on each), a given other node holds none of them with probability
``P = C(E - E/m, k) / C(E, k)``, so a token crosses to ``R = (m - 1)(1 - P)`` other nodes on
average where the all-to-all sends ``k (m - 1) / m`` copies there. Of a rank's ``S`` bytes of
copies, ``S R / k`` then leave through its NIC, at one NIC's bus bandwidth (the network tier's
figure the all-to-all uses too: DeepEP's README measures its internode kernels at 43-58 GB/s of
RDMA per GPU on 400 Gb/s ConnectX-7 NICs, which carry ~50 GB/s), while over NVLink it forwards
the copies bound for the other GPUs of its node, ``S (g - 1) / g`` for ``g`` GPUs of the group
in a node; the two run at once. Inside one node DeepEP moves what the all-to-all moves.
Qwen3-235B's 128 experts, top-8, over 4 nodes: P = 0.093, R = 2.72 nodes against 6 copies, 45%
of the all-to-all's network bytes.
"""

from __future__ import annotations

from math import comb

from nnperf.hardware.cluster import Cluster
from nnperf.kernels.collectives import CollectiveEstimate, estimate_collective, gpus_per_node


def nodes_crossed(top_k: int, experts: int, nodes: int) -> float:
    """The other nodes a token's ``top_k`` experts of ``experts``, spread evenly over
    ``nodes`` nodes, fall on, on average (uniform routing)."""
    if nodes <= 1:
        return 0.0
    per_node = experts / nodes
    missed = comb(experts - round(per_node), top_k) / comb(experts, top_k)
    return (nodes - 1) * (1 - missed)


def estimate_deduplicated(nbytes: int, group_ranks: tuple[int, ...], cluster: Cluster, top_k: int,
                          experts: int) -> CollectiveEstimate:
    """DeepEP's dispatch (or combine) of a rank's ``nbytes`` of routed copies (``top_k`` a
    token, as the all-to-all sends them) over the expert group ``group_ranks``: the module
    docstring. Inside one node, the all-to-all's own estimate."""
    per_node = gpus_per_node(cluster, group_ranks)
    if len(per_node) <= 1 or nbytes == 0:
        return estimate_collective("all_to_all", nbytes, group_ranks, cluster)
    n, nodes, most = len(group_ranks), len(per_node), max(per_node.values())
    network = nbytes * nodes_crossed(top_k, experts, nodes) / top_k / cluster.inter.busbw
    forwarded = nbytes * (most - 1) / most / cluster.intra.busbw
    moving = max(network, forwarded)
    algbw = nbytes * (n - 1) / n / moving
    return CollectiveEstimate("all_to_all", nbytes, n, cluster.inter.name, algbw, cluster.inter.latency_s,
                              cluster.inter.latency_s + moving, algorithm="deepep")
