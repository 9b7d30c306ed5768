"""The collectives model against nccl-tests' definitions, worked by hand."""

from __future__ import annotations

import pytest

from nnperf.errors import UsageError
from nnperf.hardware.cluster import cluster_for_gpu, list_clusters, load_cluster
from nnperf.kernels.collectives import bus_factor, estimate_collective


def test_bus_factors_are_nccl_tests():
    assert bus_factor("all_reduce", 8) == pytest.approx(14 / 8)
    assert bus_factor("all_gather", 8) == pytest.approx(7 / 8)
    assert bus_factor("reduce_scatter", 2) == pytest.approx(1 / 2)
    assert bus_factor("all_to_all", 4) == pytest.approx(3 / 4)
    assert bus_factor("send_recv", 2) == 1.0
    assert bus_factor("all_reduce", 1) == 0.0


def test_all_reduce_inside_a_dgx_h100_by_hand():
    """1 GiB inside a DGX H100: NVLink SHARP (25 us, 480 GB/s from nccl-tests) beats the ring
    (8.4 us + 2(n-1) hops x 3.4 us, 0.82 x 450 GB/s); an all-gather has no NVLS: the ring."""
    cluster = load_cluster("dgx-h100")
    est = estimate_collective("all_reduce", 2**30, tuple(range(8)), cluster)
    ring = (8.4 + 14 * 3.4) * 1e-6 + 2**30 * 2 * 7 / 8 / (450e9 * 0.82)
    nvls = 25e-6 + 2**30 * 2 * 7 / 8 / 480e9
    assert est.tier == "intra" and (est.algorithm, est.protocol) == ("nvls", "Simple")
    assert est.time_s == pytest.approx(nvls) and nvls < ring
    # nccl-tests' identity: busbw = algbw x 2(n-1)/n once latency is negligible
    assert est.algbw * 2 * 7 / 8 == pytest.approx(480e9, rel=0.02)
    gather = estimate_collective("all_gather", 2**30, tuple(range(8)), cluster)
    assert (gather.algorithm, gather.protocol) == ("ring", "Simple")
    assert gather.time_s == pytest.approx((8.4 + 7 * 3.4) * 1e-6 + 2**30 * 7 / 8 / (450e9 * 0.82))
    # no NVLink SHARP on A100: the ring
    a100 = estimate_collective("all_reduce", 2**30, tuple(range(8)), load_cluster("dgx-a100"))
    assert a100.algorithm == "ring"


def test_collectives_inside_a_dgx_b200_by_hand():
    """1 GiB inside a DGX B200 (NVLink 5, 900 GB/s each way): an all-gather on the ring at NCCL's
    own Blackwell NVLink figure (src/graph/topo.h SM100_NVLINK_BW, 40.1 GB/s for each of 18
    links: 721.8 GB/s), an all-reduce by NVLink SHARP at the 830 GB/s nccl-tests busbw reported
    on 8 B200 (NCCL issue #1807); NCCL's ring and NVLS latencies as on Hopper."""
    cluster = load_cluster("dgx-b200")
    assert cluster.gpu == "b200" and cluster.generation == "blackwell"
    assert cluster_for_gpu("b200") == cluster  # what `nnperf plan --gpu b200` plans on
    assert cluster.intra.busbw == pytest.approx(40.1e9 * 18, rel=0.01)
    gather = estimate_collective("all_gather", 2**30, tuple(range(8)), cluster)
    assert (gather.algorithm, gather.protocol) == ("ring", "Simple")
    assert gather.time_s == pytest.approx((8.4 + 7 * 3.4) * 1e-6 + 2**30 * 7 / 8 / (900e9 * 0.80))
    reduce = estimate_collective("all_reduce", 2**30, tuple(range(8)), cluster)
    assert reduce.algorithm == "nvls"
    assert reduce.time_s == pytest.approx(25e-6 + 2**30 * 2 * 7 / 8 / 830e9)
    # between nodes each GPU has its own 400 Gb/s NIC, as in a DGX H100
    across = estimate_collective("all_gather", 2**28, tuple(range(0, 16, 2)), cluster)
    assert across.tier == "inter" and across.busbw == pytest.approx(4 * 50e9 * 0.8)


def test_a_group_of_one_gpu_per_node_runs_at_the_nic_rate():
    cluster = load_cluster("dgx-h100")
    inside = estimate_collective("all_gather", 2**28, tuple(range(8)), cluster)
    across = estimate_collective("all_gather", 2**28, tuple(range(0, 64, 8)), cluster)  # 8 nodes, 1 GPU each
    assert across.tier == "inter" and inside.tier == "intra"
    assert across.busbw == pytest.approx(50e9 * 0.8)
    # one GPU per node: NCCL's PAT all-gather (8 us + log2(8) x 14/3.5 us + 2.8 us per rank) at
    # 0.75 of the bus bandwidth, against the ring (8.4 us + 7 network hops of the tree's 14 us)
    pat = (8.0 + 3 * 14 / 3.5 + 8 * 2.8) * 1e-6 + 2**28 / (0.75 * 50e9 * 0.8)
    ring = (8.4 + 7 * 14) * 1e-6 + 2**28 * 7 / 8 / (50e9 * 0.8)
    assert across.time_s == pytest.approx(min(pat, ring))
    assert across.algorithm == ("pat" if pat < ring else "ring")


def test_a_group_across_nodes_spreads_over_its_nics():
    """4 GPUs in each of 2 nodes: 4 rings, one per NIC (NCCL multi-rail), 4 x 40 GB/s; a group of
    all 8 GPUs of 2 nodes would reach 8 x 40 = 320 GB/s, under NVLink's 0.82 x 450."""
    cluster = load_cluster("dgx-h100")
    four = estimate_collective("all_gather", 2**28, tuple(range(0, 16, 2)), cluster)
    assert four.busbw == pytest.approx(4 * 50e9 * 0.8)
    assert four.time_s >= 2**28 * 7 / 8 / (4 * 50e9 * 0.8)
    full = estimate_collective("all_reduce", 2**30, tuple(range(16)), cluster)
    assert full.busbw == pytest.approx(8 * 50e9 * 0.8)


def test_small_messages_are_latency_bound():
    est = estimate_collective("all_reduce", 8, tuple(range(8)), load_cluster("dgx-a100"))
    assert est.time_s == pytest.approx(est.latency_s, rel=1e-3)
    # NCCL's LL ring on NVLink: 6.6 us + 14 hops x 0.6 us
    assert (est.algorithm, est.protocol) == ("ring", "LL")
    assert est.latency_s == pytest.approx((6.6 + 14 * 0.6) * 1e-6)


def test_point_to_point_keeps_the_tier_latency():
    cluster = load_cluster("dgx-h100")
    est = estimate_collective("all_to_all", 2**20, tuple(range(8)), cluster)
    assert est.latency_s == cluster.intra.latency_s and est.algorithm == ""
    assert est.time_s == pytest.approx(cluster.intra.latency_s + 2**20 * 7 / 8 / cluster.intra.busbw)


def test_an_all_to_all_across_nodes_leaves_through_each_gpus_nic():
    """16 GPUs on 2 DGX H100 nodes: each rank's 8/16 of S for the other node through its own
    NIC's share (0.8 x 50 GB/s, beside its 7/16 over NVLink at 0.82 x 450 GB/s), not the
    node's 8 rails a ring spreads over; 4 GPUs in each of 4 nodes: 12/16 over the network."""
    cluster = load_cluster("dgx-h100")
    size = 8 * 2**20
    two = estimate_collective("all_to_all", size, tuple(range(16)), cluster)
    assert two.tier == "inter"
    assert two.time_s == pytest.approx(25e-6 + size * 8 / 16 / (50e9 * 0.8))
    four = estimate_collective("all_to_all", size, tuple(r for node in range(4) for r in range(8 * node, 8 * node + 4)),
                               cluster)
    assert four.time_s == pytest.approx(25e-6 + size * 12 / 16 / (50e9 * 0.8))
    # nccl-tests' busbw of the two-node case: S x 15/16 over the time moving bytes
    assert two.busbw == pytest.approx(size * 15 / 16 / (size * 8 / 16 / (50e9 * 0.8)))


def test_every_cluster_file_loads_with_sources():
    for name in list_clusters():
        cluster = load_cluster(name)
        assert cluster.sources and cluster.intra.busbw > cluster.inter.busbw


def test_a_bad_cluster_file_is_one_line(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('name = "x"\ngpu = "h100-sxm"\ngpus_per_node = 8\n[intra]\nlink_gbs = 450\n'
                    'efficiency = 2\nlatency_us = 5\n[inter]\nlink_gbs = 50\nefficiency = 0.8\nlatency_us = 20\n')
    with pytest.raises(UsageError, match=r"intra\.efficiency"):
        load_cluster(str(path))
    with pytest.raises(UsageError, match="unknown cluster"):
        load_cluster("dgx-z9")
    path.write_text('name = "x"\ngpu = "h100-sxm"\ngpus_per_node = 8\n[intra]\nlink_gbs = 450\n'
                    'efficiency = 0.8\nlatency_us = 5\ncollective_ctas = 2.5\n[inter]\nlink_gbs = 50\n'
                    'efficiency = 0.8\nlatency_us = 20\n')
    with pytest.raises(UsageError, match=r"intra\.collective_ctas.*whole number"):
        load_cluster(str(path))


def test_collective_thread_blocks_are_optional_and_sourced(tmp_path):
    """A cluster file without them loads (no slowdown of overlapped kernels is modelled); the
    shipped ones name a source or list the value as unverified."""
    path = tmp_path / "mine.toml"
    path.write_text('name = "x"\ngpu = "h100-sxm"\ngpus_per_node = 8\n[intra]\nlink_gbs = 450\n'
                    'efficiency = 0.8\nlatency_us = 5\n[inter]\nlink_gbs = 50\nefficiency = 0.8\nlatency_us = 20\n')
    assert load_cluster(str(path)).intra.collective_ctas is None
    for name in list_clusters():
        cluster = load_cluster(name)
        for tier in (cluster.intra, cluster.inter):
            assert tier.collective_ctas is not None
            key = f"{tier.name}.collective_ctas"
            assert key in cluster.unverified or any(key in s for s in cluster.sources), (name, key)
