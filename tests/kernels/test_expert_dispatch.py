"""DeepEP's dispatch (``kernels.expert_dispatch``): a token crosses once to each other node
holding one of its experts, counted by hand and by drawing routings."""

from __future__ import annotations

import random

import pytest

from nnperf.hardware.cluster import load_cluster
from nnperf.kernels.collectives import estimate_collective
from nnperf.kernels.expert_dispatch import estimate_deduplicated, nodes_crossed


def test_nodes_crossed_by_hand():
    # 8 experts over 2 nodes, top-2: the other node holds neither with C(4, 2) / C(8, 2) = 6 / 28
    assert nodes_crossed(2, 8, 2) == pytest.approx(1 - 6 / 28)
    # one node: nothing crosses; one expert a token: the other nodes' share of the experts
    assert nodes_crossed(8, 128, 1) == 0.0
    assert nodes_crossed(1, 64, 4) == pytest.approx(3 / 4)


def test_nodes_crossed_is_the_mean_over_drawn_routings():
    """Qwen3-235B's 128 experts, top-8, over the 4 nodes of EP 32: the distinct other nodes of
    20,000 drawn tokens (experts 0-31 on node 0, the token's own)."""
    draw = random.Random(0)
    crossed = [len({e // 32 for e in draw.sample(range(128), 8)} - {0}) for _ in range(20_000)]
    assert nodes_crossed(8, 128, 4) == pytest.approx(sum(crossed) / len(crossed), rel=0.01)


def test_dispatch_across_nodes_by_hand():
    """A rank's 64 MiB of routed copies (top-8 of 128) over EP 32 on 4 DGX H100 nodes: the
    network carries S x R / 8 at one NIC's bus bandwidth, NVLink S x 7/8 at its own, at once;
    NCCL's all-to-all sends S x 24/32 over the NIC."""
    cluster = load_cluster("dgx-h100")
    size, group = 64 * 2**20, tuple(range(32))
    crossed = 3 * (1 - _missed(128, 32, 8))  # 3 other nodes, each holding none with that chance
    network = size * crossed / 8 / cluster.inter.busbw
    forwarded = size * 7 / 8 / cluster.intra.busbw
    estimate = estimate_deduplicated(size, group, cluster, 8, 128)
    assert estimate.time_s == pytest.approx(cluster.inter.latency_s + max(network, forwarded))
    plain = estimate_collective("all_to_all", size, group, cluster)
    assert plain.time_s == pytest.approx(cluster.inter.latency_s + size * 24 / 32 / cluster.inter.busbw)
    assert estimate.time_s < 0.5 * plain.time_s


def test_inside_one_node_it_is_the_all_to_all():
    cluster = load_cluster("dgx-h100")
    size, group = 2**24, tuple(range(8))
    assert (estimate_deduplicated(size, group, cluster, 8, 128).time_s
            == estimate_collective("all_to_all", size, group, cluster).time_s)


def _missed(experts: int, per_node: int, k: int) -> float:
    """The chance that none of ``k`` of ``experts`` falls among one node's ``per_node``."""
    chance = 1.0
    for i in range(k):
        chance *= (experts - per_node - i) / (experts - i)
    return chance
