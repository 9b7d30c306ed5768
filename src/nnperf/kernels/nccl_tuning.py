"""NCCL's own cost model: which algorithm and protocol it runs a collective with, and the latency
that choice pays, as a function of the group's ranks and nodes.

NCCL does not time collectives by measurement at run time: ``ncclTopoTuneModel`` (NCCL 2.30,
``src/graph/tuning.cc``, github.com/NVIDIA/nccl commit 5067397, 2026-06) gives every
(collective, algorithm, protocol) a latency and a bandwidth, and ``ncclTopoGetAlgoTime`` picks
the one with the least ``latency + bytes / bandwidth``. This module is that model, its
constants copied from the file (``ncclTunerConstantsDefaults``), for the algorithms NCCL runs
all-reduce, all-gather and reduce-scatter with on NVLink nodes joined by InfiniBand:

- ring: ``nsteps`` hops around the ring (2(n-1) for all-reduce, n-1 for all-gather and
  reduce-scatter), each paying a hardware latency: NVLink (or PCIe) inside a node, the network
  for the ``nInterSteps`` hops between nodes (2(nodes-1), or nodes-1), and at least NCCL's
  network post overhead on every hop once the ring leaves the node (1 us on Intel hosts, 2 us
  on AMD, three times that with the Simple protocol);
- tree (all-reduce only): up and down a chain inside each node and a binary tree across nodes:
  ``2 ((ppn-1) intra + log2(nodes) inter)``;
- PAT (all-gather and reduce-scatter with one GPU per node, NCCL >= 2.23): ``log2(nodes)
  inter/3.5 + 2.8 us n``;
- NVLS (all-reduce inside one NVSwitch node of Hopper or later: the switch reduces, NVLink
  SHARP): 25 us (``hwLatencies[NVLINK][NVLS][Simple]``, no base latency), at the bus bandwidth
  the cluster file states from nccl-tests (NCCL's own NVLS bandwidth needs its topology search);
- NVLS tree (all-reduce across NVSwitch nodes, Simple only): NVLS inside each node and a tree
  of the nodes over the network, ``25 + 2 log2(nodes) 20.9 us``; its bus bandwidth is the least
  of NVLS's inside a node, the network's (twice it on two nodes: "Handle 2 node case of
  NVLSTree") and ``perChMaxNVLSTreeBws`` per channel. NCCL reads the network's per channel off
  its topology search; here it is the ring's bus bandwidth across nodes (the cluster file's).

Protocols: Simple (full bandwidth, the largest latency), LL128 (0.92 of it; on NVLink nodes)
and LL (half of it, at most ``llMaxBw``; the least latency). The bandwidth of Simple on a ring
is the tier's bus bandwidth (``kernels.collectives``, from the cluster file); the other
protocols and algorithms scale it as NCCL does. Not modelled: CollNet (SHARP in the network
switch), which needs NCCL's topology search and a SHARP fabric; the per-channel bandwidth
caps (NCCL's channel count is not known here; they bind only for few channels); point-to-point
(all-to-all and send/recv are grouped sends, which NCCL's tuning model does not time).
"""

from __future__ import annotations

from dataclasses import dataclass

RING, TREE, PAT, NVLS, NVLS_TREE = "ring", "tree", "pat", "nvls", "nvls_tree"
LL, LL128, SIMPLE = "LL", "LL128", "Simple"
PROTOCOLS = (LL, LL128, SIMPLE)

#: ``baseLatencies`` (us), per algorithm and protocol (LL, LL128, Simple).
BASE_LATENCY_US = {TREE: (6.8, 14.0, 8.4), RING: (6.6, 14.0, 8.4), PAT: (8.0, 8.0, 8.0)}
#: ``hwLatencies`` (us) per hop, by link, algorithm and protocol (LL, LL128, Simple).
HW_LATENCY_US = {
    "nvlink": {TREE: (0.6, 1.25, 4.0), RING: (0.6, 1.9, 3.4), PAT: (0.0, 0.0, 4.0)},
    "pcie": {TREE: (1.0, 1.9, 4.0), RING: (1.0, 2.5, 5.7), PAT: (0.0, 0.0, 4.0)},
    "net": {TREE: (5.0, 8.5, 14.0), RING: (2.7, 4.0, 14.0), PAT: (0.0, 0.0, 14.0)},
}
#: NVLS's latency (us): ``baseLatencies`` 0 and ``hwLatencies[NVLINK][NVLS][Simple]``.
NVLS_LATENCY_US = 25.0
#: NVLS tree's ``hwLatencies[NVLINK][NVLS_TREE][Simple]`` (inside the node) and
#: ``[NET][NVLS_TREE][Simple]`` (per tree level, up and down); ``baseLatencies`` 0.
NVLS_TREE_INTRA_US, NVLS_TREE_NET_US = 25.0, 20.9
#: ``perChMaxNVLSTreeBws`` (GB/s per channel) by generation: (2 nodes, more).
NVLS_TREE_MAX_GBS_PER_CHANNEL = {"hopper": (57.7, 45.5), "blackwell": (96.0, 80.0)}
#: ``getNetOverhead`` (us): the host's cost of posting one network send, by CPU vendor.
NET_OVERHEAD_US = {"intel": 1.0, "amd": 2.0}
#: ``llMaxBws`` (GB/s): LL's bandwidth cap. One node: by GPU generation; several: by CPU vendor
#: and by two nodes or more than two.
LL_MAX_GBS_ONE_NODE = {"volta": 39.0, "ampere": 87.7, "hopper": 141.0, "blackwell": 282.0}
LL_MAX_GBS_NODES = {"intel": (39.0, 20.4), "amd": (22.5, 19.0)}  # (2 nodes, more)
#: Bandwidth of each protocol relative to Simple (``ncclTopoTuneModel``'s "model refinements").
RING_PROTOCOL_SCALE = {LL: 0.5, LL128: 0.92, SIMPLE: 1.0}
TREE_ALLREDUCE_SCALE = 0.92  # tree all-reduce's bus bandwidth against the ring's
TREE_PROTOCOL_SCALE = {LL: 1 / 3.8, SIMPLE: 1.0}  # LL128: 7/9 in one node, 120/128 across
PAT_SCALE = 0.75
#: ``treeCorrectionFactor``: tree all-reduce's bandwidth by message size, powers of two from
#: 64 B (index 0, ``log2(bytes / 64)``) to 256 MiB; larger sizes: 1.
TREE_CORRECTION = {
    LL: (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    LL128: (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0),
    SIMPLE: (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9),
}
#: A multi-node Simple ring all-reduce whose per-rank chunk is not tiny pays 1.4x its latency
#: on sm80+ (1.9x before: "Plateau effect of ring").
RING_PLATEAU = 1.4
TUNED_KINDS = ("all_reduce", "all_gather", "reduce_scatter")


@dataclass(frozen=True)
class Topology:
    """What NCCL's model reads of a group: its ranks and nodes, the link inside a node, the
    hosts' CPU vendor, the GPU generation and the collective's channels (for the plateau)."""

    ranks: int
    nodes: int
    intra_link: str = "nvlink"  # nvlink | pcie
    cpu: str = "intel"  # intel | amd
    generation: str = "hopper"
    channels: int = 16
    nvls_busbw: float = 0.0  # bytes/s of an NVLS all-reduce inside a node; 0: no NVLS


@dataclass(frozen=True)
class Choice:
    """One (algorithm, protocol) of a collective: its latency and bus-bandwidth scale."""

    algorithm: str
    protocol: str
    latency_s: float
    time_s: float


def _log2i(n: int) -> int:
    """NCCL's ``log2i``: the floor of log2 (0 for 0 and 1)."""
    return max(0, int(n).bit_length() - 1)


def latency_us(kind: str, algorithm: str, protocol: str, topo: Topology) -> float:
    """``ncclTopoTuneModel``'s ``latencies[coll][algorithm][protocol]``."""
    if algorithm == NVLS:
        return NVLS_LATENCY_US
    if algorithm == NVLS_TREE:
        return NVLS_TREE_INTRA_US + 2 * _log2i(topo.nodes) * NVLS_TREE_NET_US
    p = PROTOCOLS.index(protocol)
    n, nodes = topo.ranks, topo.nodes
    ppn = n / nodes
    intra = HW_LATENCY_US[topo.intra_link][algorithm][p]
    # with one GPU per node every hop is exposed: NCCL takes the tree's network latency
    inter = HW_LATENCY_US["net"][TREE if ppn == 1 else algorithm][p]
    lat = BASE_LATENCY_US[algorithm][p]
    if algorithm == RING:
        nsteps = 2 * (n - 1) if kind == "all_reduce" else n - 1
        if nodes > 1:
            overhead = NET_OVERHEAD_US[topo.cpu] * (3 if protocol == SIMPLE else 1)
            intra = max(intra, overhead)
        inter_steps = 0 if nodes == 1 else (2 * (nodes - 1) if kind == "all_reduce" else nodes - 1)
        return lat + (nsteps - inter_steps) * intra + inter_steps * inter
    if algorithm == TREE:
        return lat + 2 * ((n // nodes - 1) * intra + _log2i(nodes) * inter)
    if algorithm == PAT:
        return lat + _log2i(nodes) * (inter / 3.5) + n * 2.8
    raise ValueError(f"unknown algorithm {algorithm!r}")


def _ll_cap_gbs(topo: Topology) -> float:
    if topo.nodes == 1:
        return LL_MAX_GBS_ONE_NODE.get(topo.generation, LL_MAX_GBS_ONE_NODE["hopper"])
    two, more = LL_MAX_GBS_NODES[topo.cpu]
    return two if topo.nodes == 2 else more


def _busbw(algorithm: str, protocol: str, ring_busbw: float, topo: Topology, nbytes: int) -> float:
    """The bus bandwidth (bytes/s) of one choice, from the tier's Simple ring bandwidth."""
    ll_cap = _ll_cap_gbs(topo) * 1e9
    if algorithm == RING:
        bw = ring_busbw * RING_PROTOCOL_SCALE[protocol]
        return min(bw, ll_cap) if protocol == LL else bw
    if algorithm == PAT:
        return ring_busbw * PAT_SCALE
    if algorithm == NVLS:
        return topo.nvls_busbw
    if algorithm == NVLS_TREE:
        return nvls_tree_busbw(ring_busbw, topo)
    return tree_busbw(protocol, ring_busbw, topo, nbytes)


def nvls_tree_busbw(ring_busbw: float, topo: Topology) -> float:
    """NVLS tree's bus bandwidth: the least of NVLS inside a node, the network (``ring_busbw``,
    twice it on two nodes) and the per-channel cap over ``topo.channels``."""
    two, more = NVLS_TREE_MAX_GBS_PER_CHANNEL.get(topo.generation, NVLS_TREE_MAX_GBS_PER_CHANNEL["hopper"])
    cap = topo.channels * (two if topo.nodes <= 2 else more) * 1e9
    return min(topo.nvls_busbw, ring_busbw * (2 if topo.nodes <= 2 else 1), cap)


def tree_busbw(protocol: str, ring_busbw: float, topo: Topology, nbytes: int) -> float:
    """A tree all-reduce's bus bandwidth for ``nbytes``: 0.92 of the ring's, scaled per
    protocol and by NCCL's correction for medium sizes (``treeCorrectionFactor``)."""
    ll_cap = _ll_cap_gbs(topo) * 1e9
    bw = ring_busbw * TREE_ALLREDUCE_SCALE
    if protocol == LL:
        bw = min(bw * TREE_PROTOCOL_SCALE[LL], ll_cap)
    elif protocol == LL128:
        bw *= 7 / 9 if topo.nodes == 1 else 120 / 128
    index = _log2i(nbytes >> 6) if nbytes >= 64 else -1
    if 0 <= index < 23:
        bw *= TREE_CORRECTION[protocol][index]
    return bw


def candidates(kind: str, topo: Topology) -> list[tuple[str, str]]:
    """The (algorithm, protocol) pairs NCCL considers for ``kind`` on this group."""
    protocols = [p for p in PROTOCOLS if p != LL128 or topo.intra_link == "nvlink"]
    pairs = [(RING, p) for p in protocols]
    if kind == "all_reduce":
        pairs += [(TREE, p) for p in protocols]
        if topo.nvls_busbw > 0:
            pairs.append((NVLS, SIMPLE) if topo.nodes == 1 else (NVLS_TREE, SIMPLE))
    elif topo.nodes > 1 and topo.nodes == topo.ranks:  # ncclPatEnable: one GPU per node
        pairs.append((PAT, SIMPLE))
    return pairs


def choose(kind: str, nbytes: int, bus_factor: float, ring_busbw: float, topo: Topology) -> Choice:
    """The fastest (algorithm, protocol) for ``nbytes`` (nccl-tests' size: all-gather's
    output, reduce-scatter's input), as ``ncclTopoGetAlgoTime`` ranks them. ``bus_factor``:
    the ring's bytes on the link per byte (``kernels.collectives.bus_factor``); NCCL converts
    the other algorithms' bus bandwidth to algorithm bandwidth as /2 (tree) and 1 (PAT)."""
    if kind not in TUNED_KINDS:
        raise ValueError(f"NCCL's tuning model covers {', '.join(TUNED_KINDS)}, not {kind!r}")
    best: Choice | None = None
    for algorithm, protocol in candidates(kind, topo):
        lat = latency_us(kind, algorithm, protocol, topo)
        if (algorithm == RING and protocol == SIMPLE and kind == "all_reduce" and topo.nodes > 1
                and nbytes / (topo.channels * topo.ranks) >= 64):
            lat *= RING_PLATEAU
        # algorithm bandwidth: a tree's is half its bus bandwidth; PAT's is its bus bandwidth;
        # NVLS and NVLS tree convert as the ring does
        factor = 2.0 if algorithm == TREE else 1.0 if algorithm == PAT else bus_factor
        time = lat * 1e-6 + nbytes * factor / _busbw(algorithm, protocol, ring_busbw, topo, nbytes)
        if best is None or time < best.time_s:
            best = Choice(algorithm, protocol, lat * 1e-6, time)
    assert best is not None
    return best
